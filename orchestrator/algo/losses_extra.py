"""Built-in policy losses beyond ``ppo_clip``: GSPO, GSPO-token and CISPO (``algo.policy_loss``).

Each is a registered loss (orchestrator/algo/loss.py) that writes only its policy-gradient term between
``masked_terms`` and ``finish_loss``, so TIS, the KL term, the entropy bonus, the aggregation and the metrics
are the shared ones. GSPO's ratio is per sequence, and a sequence is never split across micro-batches or
data-parallel ranks (padded rows, or packed rows re-laid one sequence per row), so the global-normaliser
contract (cases C01/C02) holds unchanged. Pure torch; no Ray, no vLLM.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from orchestrator.algo.loss import LossInputs, MaskedTerms, finish_loss, masked_terms, register_policy_loss
from orchestrator.algo.loss_parts import LOG_RATIO_CLAMP, clipped_surrogate

__all__ = ["cispo", "cispo_weight", "gspo", "gspo_token", "sequence_log_ratio"]


def sequence_log_ratio(t: MaskedTerms) -> Tensor:
    """``log s_i = (1 / |y_i|) sum_t (logprobs - old_logprobs)`` over sequence i's masked tokens, ``[B, 1]``.

    GSPO, Zheng et al. 2025, eq. 7: ``s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1 / |y_i|)``, the geometric mean
    of the token ratios. Clamped to [-20, 20]; 0 for a row without a masked token. Differentiable in the
    logprobs.
    """
    count = t.mask.sum(dim=-1, keepdim=True).clamp(min=1)
    log_s = (t.logprobs - t.old_logprobs).sum(dim=-1, keepdim=True) / count
    return torch.clamp(log_s, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _gspo(inputs: LossInputs, cfg: Any, token: bool) -> tuple[Tensor, dict[str, float]]:
    t = masked_terms(inputs)
    log_s = sequence_log_ratio(t)
    if token:  # s_i,t = sg[s_i] * pi / sg[pi]: the value of s_i, the gradient of token t alone
        ratio = torch.exp(t.logprobs - t.logprobs.detach() + log_s.detach())
    else:
        ratio = torch.exp(log_s).expand_as(t.logprobs)
    low, high = cfg.gspo_clip_low, cfg.gspo_clip_high
    if not (low >= 0 and high >= 0):
        raise ValueError(f"gspo_clip_low / gspo_clip_high: must be >= 0, got {low} / {high}")
    pg, clipped = clipped_surrogate(ratio, t.advantages, low, high)
    return finish_loss(pg, clipped, dataclasses.replace(t, ratio=ratio), inputs, cfg)


_GSPO_PAPER = {"loss_agg": "seq-mean-token-mean", "gspo_clip_low": 3e-4, "gspo_clip_high": 4e-4}


@register_policy_loss("gspo", _GSPO_PAPER, "GSPO, Zheng et al. 2025, eq. 5 (1/G over sequences) and sec. 5.1 (clip)")
def gspo(inputs: LossInputs, cfg: Any) -> tuple[Tensor, dict[str, float]]:
    """GSPO, Zheng et al. 2025 ("Group Sequence Policy Optimization"), eq. 5-7: the sequence ratio, clipped.

    Per sequence ``i`` with ``s_i = exp(mean_t(logprobs - old_logprobs))`` (``sequence_log_ratio``), every
    response token of ``i`` carries::

        pg_t = max(-A_t s_i, -A_t clamp(s_i, 1 - gspo_clip_low, 1 + gspo_clip_high))

    (``cfg.gspo_clip_low`` / ``gspo_clip_high``; the paper uses 3e-4 / 4e-4). With
    ``loss_agg="seq-mean-token-mean"`` and one advantage per sequence the loss is eq. 5's
    ``-(1/G) sum_i min(s_i A_i, clip(s_i) A_i)``, and its gradient eq. 6: ``-(A_i s_i / |y_i|) sum_t
    grad log pi(y_i,t)`` when unclipped, 0 when clipped. Other aggregations weight the sequences as they do
    for ``ppo_clip``. ``actor/ratio_mean`` and the clip fractions refer to ``s_i`` (per token).

    Returns:
        ``(loss, metrics)`` as ``ppo_clip`` (no dual clip).
    Raises:
        ValueError: a negative ``gspo_clip_low`` / ``gspo_clip_high``.
    """
    return _gspo(inputs, cfg, token=False)


@register_policy_loss("gspo_token", _GSPO_PAPER, "GSPO-token, Zheng et al. 2025, eq. 13 and sec. 5.1")
def gspo_token(inputs: LossInputs, cfg: Any) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token, Zheng et al. 2025, eq. 13-14: ``s_i,t = sg[s_i] * pi(y_i,t) / sg[pi(y_i,t)]``.

    Numerically ``s_i,t = s_i`` (loss and metrics equal ``gspo``'s), but token t's gradient is
    ``-A_i,t s_i grad log pi(y_i,t)`` (times the aggregation's weight, ``1 / |y_i|`` per sequence under
    ``seq-mean-token-mean``): per-token advantages ``A_i,t`` act on their own token. With a sequence-constant
    advantage the gradient equals ``gspo``'s. Clipping as ``gspo`` (``gspo_clip_low`` / ``gspo_clip_high``).
    """
    return _gspo(inputs, cfg, token=True)


def cispo_weight(ratio: Tensor, clip_low: Any, clip_high: float) -> Tensor:
    """CISPO's importance weight ``sg(clamp(r, 1 - clip_low, 1 + clip_high))``, ``[B, T]``; no lower bound
    when ``clip_low`` is None (MiniMax-M1's choice)."""
    low = None if clip_low is None else 1.0 - clip_low
    return torch.clamp(ratio, min=low, max=1.0 + clip_high).detach()


@register_policy_loss("cispo", {"loss_agg": "token-mean", "cispo_clip_low": None},
                      "CISPO, MiniMax-M1 2025, eq. 4 (1 / sum_i |o_i|; no lower weight bound)")
def cispo(inputs: LossInputs, cfg: Any) -> tuple[Tensor, dict[str, float]]:
    """CISPO, MiniMax 2025 ("MiniMax-M1", arXiv 2506.13585), eq. 4-5: clip the weight, keep every token.

    Per response token, with ``r_t = exp(logprobs - old_logprobs)``::

        w_t  = sg(clamp(r_t, 1 - cispo_clip_low, 1 + cispo_clip_high))   (no lower bound if cispo_clip_low is None)
        pg_t = -w_t * A_t * logprobs_t

    so the gradient of every token is ``-w_t A_t grad log pi`` (the weighted REINFORCE gradient): unlike
    PPO, no token leaves the gradient. ``actor/clip_frac`` (and its sides) counts the tokens whose weight
    was clamped. ``cfg.cispo_clip_low``: None or >= 0; ``cfg.cispo_clip_high``: >= 0.

    Raises:
        ValueError: a negative ``cispo_clip_low`` / ``cispo_clip_high``.
    """
    low, high = cfg.cispo_clip_low, cfg.cispo_clip_high
    if not (high >= 0 and (low is None or low >= 0)):
        raise ValueError(f"cispo_clip_low / cispo_clip_high: must be >= 0 (low may be null), got {low} / {high}")
    t = masked_terms(inputs)
    w = cispo_weight(t.ratio, low, high)
    pg = -w * t.advantages * t.logprobs
    clipped = t.ratio > 1.0 + high
    if low is not None:
        clipped = clipped | (t.ratio < 1.0 - low)
    return finish_loss(pg, clipped, t, inputs, cfg)
