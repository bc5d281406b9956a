"""GRPO policy loss (PPO clipped surrogate) and its global-batch normalisation.

The normaliser is computed once for the whole global batch, before it is split into data-parallel
shards and micro-batches, so that gradient accumulation plus DDP/FSDP gradient averaging reproduces the
un-split batch's loss and gradient exactly (correctness cases C01, C02). Pure torch; no Ray, no vLLM::

    n = loss_normalizer(global_mask, "token-mean", dp_size=D)   # once, on the global batch
    for mb in this_rank_micro_batches:
        loss, metrics = policy_loss(..., loss_agg="token-mean", normalizer=n)
        loss.backward()                                         # accumulate; no further division
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from orchestrator.algo.kl import kl_penalty

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_LOG_RATIO_CLAMP = 20.0  # |log ratio| bound before exp() in the policy ratio and the TIS weight


def _check_loss_agg(loss_agg: str, max_response_len: int | None) -> None:
    if loss_agg not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg: unknown value {loss_agg!r}; allowed: {list(LOSS_AGG_MODES)}")
    if loss_agg == "seq-mean-token-sum-norm" and (max_response_len is None or max_response_len <= 0):
        raise ValueError(
            "max_response_len: a positive int is required for loss_agg='seq-mean-token-sum-norm' "
            f"(Dr. GRPO), got {max_response_len!r}"
        )


def loss_normalizer(
    response_mask: Tensor, loss_agg: str, *, max_response_len: int | None = None, dp_size: int = 1
) -> float:
    """Denominator ``N`` of the loss for one global batch, computed before any split.

    Contract: ``policy_loss(..., normalizer=N)`` on any micro-batch returns ``sum(units) / N``, a unit
    being a token's loss (``"token-mean"``), a sequence's token-mean loss (``"seq-mean-token-mean"``)
    or a sequence's token sum / ``max_response_len`` (``"seq-mean-token-sum-norm"``, Dr. GRPO, Liu et
    al. 2025). Summing micro-batch losses on a rank and averaging gradients over ``dp_size`` ranks then
    gives exactly the un-split batch's mean over units. So ``N = units in global batch / dp_size``,
    counting response tokens, or sequences with at least one response token (empty sequences
    contribute nothing, so padding rows do not change the loss).

    Args:
        response_mask: ``[B, T]`` bool / int / float, nonzero on response tokens of the WHOLE global
            batch (all ranks, all micro-batches).
        loss_agg: ``"token-mean"``, ``"seq-mean-token-mean"`` or ``"seq-mean-token-sum-norm"``.
        max_response_len: required (> 0) for ``"seq-mean-token-sum-norm"``; checked here so that a
            misconfiguration fails before training (``policy_loss`` uses it).
        dp_size: number of data-parallel ranks whose gradients are averaged, >= 1.

    Returns:
        ``N`` as a python float, > 0.

    Raises:
        ValueError: unknown ``loss_agg``, missing ``max_response_len`` for Dr. GRPO, ``dp_size < 1``,
            a mask that is not 2-D or has no response token.
    """
    _check_loss_agg(loss_agg, max_response_len)
    if dp_size < 1:
        raise ValueError(f"dp_size: must be >= 1, got {dp_size}")
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask: expected [B, T], got shape {tuple(response_mask.shape)}")
    mask = response_mask != 0
    num_tokens = int(mask.sum().item())
    if num_tokens == 0:
        raise ValueError("response_mask: the global batch has no response tokens; the loss is undefined")
    if loss_agg == "token-mean":
        return num_tokens / dp_size
    return int(mask.any(dim=-1).sum().item()) / dp_size


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    normalizer: float,
    max_response_len: int | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    rollout_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clipping, optional KL penalty and truncated IS.

    Per response token, with ``ratio = exp(logprobs - old_logprobs)`` (log ratio clamped to [-20, 20])::

        pg = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)) * w
        loss_token = pg + kl_coef * kl_penalty(logprobs, ref_logprobs, kl_estimator)

    PPO, Schulman et al. 2017, eq. 7; GRPO, Shao et al. 2024, eq. 3 (each token gets its sequence's
    advantage); separate ``clip_low`` / ``clip_high`` is Clip-Higher (DAPO, Yu et al. 2025, section
    3.1). ``w = min(exp(old_logprobs - rollout_logprobs), tis_cap)``, detached, is truncated importance
    sampling between sampler and trainer (TIS, Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"); it weights only the policy-gradient term and is 1 unless both
    ``rollout_logprobs`` and ``tis_cap`` are given. Tokens are aggregated per ``loss_agg`` and divided
    by ``normalizer`` (see ``loss_normalizer``). Masked-out tokens contribute exactly nothing: NaN/inf
    there reach neither the loss nor the gradients (``torch.where``, never multiplication).

    Args:
        logprobs: ``[B, T]`` float, current policy logprobs of the sampled tokens (differentiable).
        old_logprobs: ``[B, T]`` float, logprobs of the policy the advantages refer to (detached).
        advantages: ``[B]`` float, one advantage per sequence.
        mask: ``[B, T]`` bool / int / float, nonzero on response tokens.
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``; both >= 0.
        loss_agg: ``"token-mean"``, ``"seq-mean-token-mean"`` or ``"seq-mean-token-sum-norm"``.
        normalizer: ``loss_normalizer(global_mask, loss_agg, ..., dp_size=D)``, > 0.
        max_response_len: constant divisor of ``"seq-mean-token-sum-norm"`` (Dr. GRPO); required there.
        ref_logprobs: ``[B, T]`` reference-model logprobs; required when ``kl_coef > 0``.
        kl_coef: weight of the KL penalty, >= 0; ``kl_estimator``: ``"k1"``, ``"k2"`` or ``"k3"``.
        rollout_logprobs: ``[B, T]`` logprobs reported by the sampler, for TIS.
        tis_cap: cap of the TIS weight, > 0; needs ``rollout_logprobs``.

    Returns:
        ``(loss, metrics)``: a float32 scalar tensor, and python floats over this micro-batch's
        response tokens: ``actor/pg_loss`` (token mean of pg), ``actor/kl`` (token mean; 0.0 without
        ``ref_logprobs``), ``actor/clip_frac`` (fraction where the clipped branch is strictly larger),
        ``actor/ratio_mean``, ``actor/tis_weight_mean`` (TIS only), ``actor/tokens`` (count).

    Raises:
        ValueError: a shape mismatch (naming the argument), unknown ``loss_agg`` / ``kl_estimator``,
            missing ``max_response_len``, ``kl_coef > 0`` without ``ref_logprobs``, ``tis_cap``
            without ``rollout_logprobs``, a non-positive ``normalizer`` / ``tis_cap``, a negative clip.
    """
    _check_loss_agg(loss_agg, max_response_len)
    _check_shapes(logprobs, advantages, mask, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
                  rollout_logprobs=rollout_logprobs)
    _check_scalars(clip_low, clip_high, normalizer, kl_coef, tis_cap, ref_logprobs, rollout_logprobs)
    m = mask != 0
    lp, old = _masked(logprobs, m), _masked(old_logprobs, m)
    adv = _masked(advantages.unsqueeze(-1).expand_as(logprobs), m)
    ratio = torch.exp(torch.clamp(lp - old, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    weight = None
    if tis_cap is not None and rollout_logprobs is not None:
        log_w = torch.clamp(old - _masked(rollout_logprobs, m), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        weight = torch.clamp(torch.exp(log_w), max=tis_cap).detach()
        pg = pg * weight
    kl = kl_penalty(lp, _masked(ref_logprobs, m), kl_estimator) if ref_logprobs is not None else None
    per_token = pg + kl_coef * kl if (kl is not None and kl_coef > 0) else pg
    loss = _aggregate(per_token.float(), m, loss_agg, normalizer, max_response_len)
    return loss, _metrics(m, pg, kl, unclipped, clipped, ratio, weight)


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with masked-out entries replaced by 0 (``where``: their NaN/inf and gradients vanish)."""
    return torch.where(mask, x, torch.zeros_like(x))


def _aggregate(
    per_token: Tensor, mask: Tensor, loss_agg: str, normalizer: float, max_len: int | None
) -> Tensor:
    """Sum of this micro-batch's units (see ``loss_normalizer``) divided by ``normalizer``."""
    seq_sum = _masked(per_token, mask).sum(dim=-1)
    if loss_agg == "token-mean":
        return seq_sum.sum() / normalizer
    if loss_agg == "seq-mean-token-mean":
        count = mask.sum(dim=-1)
        seq_mean = torch.where(count > 0, seq_sum / count.clamp(min=1), torch.zeros_like(seq_sum))
        return seq_mean.sum() / normalizer
    assert max_len is not None  # checked by _check_loss_agg
    return (seq_sum / max_len).sum() / normalizer


def _check_shapes(logprobs: Tensor, advantages: Tensor, mask: Tensor, **others: Tensor | None) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs: expected [B, T], got shape {tuple(logprobs.shape)}")
    for name, tensor in {"mask": mask, **others}.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} != logprobs shape {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        expected = tuple(logprobs.shape[:1])
        raise ValueError(f"advantages: expected [B] = {expected}, got shape {tuple(advantages.shape)}")


def _check_scalars(
    clip_low: float, clip_high: float, normalizer: float, kl_coef: float, tis_cap: float | None,
    ref_logprobs: Tensor | None, rollout_logprobs: Tensor | None,
) -> None:
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(f"clip_low / clip_high: must be >= 0, got {clip_low} / {clip_high}")
    if not (math.isfinite(normalizer) and normalizer > 0):
        raise ValueError(f"normalizer: must be finite and > 0, got {normalizer}")
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef: must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs: required when kl_coef > 0")
    if tis_cap is not None and rollout_logprobs is None:
        raise ValueError("rollout_logprobs: required when tis_cap is set (truncated IS)")
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap: must be > 0, got {tis_cap}")


@torch.no_grad()
def _metrics(mask: Tensor, pg: Tensor, kl: Tensor | None, unclipped: Tensor, clipped: Tensor,
             ratio: Tensor, weight: Tensor | None) -> dict[str, float]:
    """Token means over one micro-batch's response tokens, fetched with a single device sync."""
    count = mask.sum().to(torch.float32)
    denom = count.clamp(min=1.0)

    def mean(x: Tensor) -> Tensor:
        return _masked(x.float(), mask).sum() / denom

    metrics = {"actor/pg_loss": mean(pg), "actor/kl": mean(kl) if kl is not None else count.new_zeros(()),
               "actor/clip_frac": mean((clipped > unclipped).float()), "actor/ratio_mean": mean(ratio),
               "actor/tokens": count}
    if weight is not None:
        metrics["actor/tis_weight_mean"] = mean(weight)
    return dict(zip(metrics, torch.stack(list(metrics.values())).tolist()))
