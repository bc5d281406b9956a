"""How far the rollout engine's logprobs are from the trainer's, every train step: the `rollout/mismatch_*` metrics.

Per response token, with ``log rho_t = trainer_t - rollout_t`` (the trainer's logprobs of the sampling policy
minus the engine's, clamped to [-20, 20]) and the tokens sampled from the rollout policy ``mu``:

- ``rollout/mismatch_kl_k1`` = mean of ``-log rho_t``: the k1 estimate of KL(mu || pi) (Schulman 2020);
- ``rollout/mismatch_kl_k3`` = mean of ``rho_t - 1 - log rho_t``: the k3 estimate (>= 0 per token);
- ``rollout/mismatch_ratio_max`` / ``_ratio_min``: the largest / smallest ``rho_t`` of the step;
- ``rollout/mismatch_masked_token_frac``: response tokens the correction (orchestrator/algo/mismatch.py)
  leaves out of the policy-gradient term, over response tokens;
- ``rollout/mismatch_masked_seq_frac``: sequences with response tokens none of which is kept, over those.

The trainer feeds every micro-batch (``micro_batch``: token sums that its own per-micro-batch sums carry
through the data-parallel reduction), hands each mini-batch's rank-summed sums back (``absorb``) and ends
the step with ``finish`` (the extremes reduced by max over ranks): the metrics of the whole step's batch,
exact whatever the micro-batch, mini-batch and rank split. Pure torch; no Ray, no vLLM::

    stats = MismatchStats(algo_cfg)
    sums = stats.micro_batch(old, logprobs, rollout, mask)   # per micro-batch, added to the trainer's sums
    rest = stats.absorb(reduced_sums)                        # per mini-batch, after the rank reduction
    row.update(stats.finish(all_max))                        # once per step
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from orchestrator.algo.loss_parts import masked
from orchestrator.algo.mismatch import correction, log_ratio

PREFIX = "mismatch_sum/"  # the micro-batch sums' keys in the trainer's sums dict (never in the row)
SUM_NAMES = ("k1", "k3", "tokens", "masked_tokens", "seqs", "masked_seqs")


class MismatchStats:
    """One train step's rollout/trainer mismatch statistics (see the module docstring)."""

    def __init__(self, cfg: Any):
        self.cfg = cfg  # the algo config: the correction whose masks are counted
        self.totals = dict.fromkeys(SUM_NAMES, 0.0)
        self.peaks = [-math.inf, -math.inf]  # max log rho, max -log rho over this rank's tokens

    @torch.no_grad()
    def micro_batch(self, old_logprobs: Tensor, logprobs: Tensor, rollout_logprobs: Tensor,
                    mask: Tensor) -> dict[str, float]:
        """Sums over one micro-batch for the trainer's per-micro-batch sums (the trainer divides ``actor/*`` by
        the tokens; ``mismatch_sum/<name>`` come back through ``absorb``).

        Args:
            old_logprobs: ``[B, T]`` float, the loss's old logprobs: the trainer's logprobs of the sampling
                policy with ``algo.old_logprobs=trainer`` (with ``rollout`` the current ``logprobs`` are used).
            logprobs: ``[B, T]`` float, the current policy's (detached).
            rollout_logprobs: ``[B, T]`` float, the engine's. mask: ``[B, T]`` bool, trained response tokens.
        Returns:
            python floats: ``actor/logprob_gap_abs`` (sum of ``|logprobs - rollout|``), ``actor/rollout_kl_k1``
            (sum of ``rollout - logprobs``), and ``mismatch_sum/``: the ``k1`` and ``k3`` sums, ``tokens``,
            ``masked_tokens``, ``seqs`` (rows with a response token) and ``masked_seqs``; the extremes stay on
            the object (``finish``).
        """
        trainer_lp = old_logprobs if getattr(self.cfg, "old_logprobs", "trainer") == "trainer" else logprobs
        lr = log_ratio(trainer_lp.float(), rollout_logprobs.float(), mask)
        kept = correction(masked(trainer_lp, mask), rollout_logprobs, mask, self.cfg).kept
        has = mask.any(dim=-1)
        gap = logprobs - rollout_logprobs
        sums = torch.stack([masked_sum(gap.abs(), mask), masked_sum(-gap, mask), masked_sum(-lr, mask),
                            masked_sum(torch.expm1(lr) - lr, mask)] + [
            x.sum().double() for x in (mask, mask & ~kept, has, has & ~kept.any(dim=-1))]).tolist()
        if bool(mask.any()):
            hi, lo = lr[mask].max(), (-lr[mask]).max()
            self.peaks = [max(self.peaks[0], float(hi)), max(self.peaks[1], float(lo))]
        out = {"actor/logprob_gap_abs": sums[0], "actor/rollout_kl_k1": sums[1]}
        out.update({PREFIX + k: v for k, v in zip(SUM_NAMES, sums[2:])})
        return out

    def absorb(self, sums: dict[str, float]) -> dict[str, float]:
        """Add a mini-batch's sums (already summed over micro-batches and ranks) to the step's totals; returns
        ``sums`` without them."""
        for name in SUM_NAMES:
            self.totals[name] += sums.get(PREFIX + name, 0.0)
        return {k: v for k, v in sums.items() if not k.startswith(PREFIX)}

    def finish(self, all_max: Callable[[list[float]], list[float]]) -> dict[str, float]:
        """The step's ``rollout/mismatch_*`` metrics. ``all_max``: element-wise max over the data-parallel
        ranks (a collective on ``ShardedTrainer``: every rank calls ``finish``). No tokens: an empty dict."""
        hi, lo = all_max(list(self.peaks))
        t = self.totals
        if t["tokens"] <= 0:
            return {}
        return {"rollout/mismatch_kl_k1": t["k1"] / t["tokens"], "rollout/mismatch_kl_k3": t["k3"] / t["tokens"],
                "rollout/mismatch_ratio_max": math.exp(hi), "rollout/mismatch_ratio_min": math.exp(-lo),
                "rollout/mismatch_masked_token_frac": t["masked_tokens"] / t["tokens"],
                "rollout/mismatch_masked_seq_frac": t["masked_seqs"] / max(t["seqs"], 1.0)}


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum of ``x`` [B, T] over the bool ``mask``, float64 (exact token counts and stable sums)."""
    return torch.where(mask, x.double(), torch.zeros((), dtype=torch.float64, device=x.device)).sum()
