"""The parts policy losses are assembled from: ratio, clipping, importance correction, KL term, aggregation.

Each part is a small pure function over ``[B, T]`` tensors; a registered loss (orchestrator/algo/loss.py,
or a user's file) composes them. The aggregation divides by a normaliser computed once for the whole
global batch, before it is split into data-parallel shards and micro-batches, so that gradient
accumulation plus DDP/FSDP gradient averaging reproduces the un-split batch's loss and gradient exactly
(correctness cases C01, C02). Pure torch; no Ray, no vLLM::

    n = loss_normalizer(global_mask, "token-mean", dp_size=D)   # once, on the global batch
    for mb in this_rank_micro_batches:
        loss, metrics = compute_policy_loss(LossInputs(..., normalizer=n), cfg)
        loss.backward()                                         # accumulate; no further division

Masked-out tokens contribute exactly nothing: the parts expect inputs passed through ``masked`` first
(``torch.where``, never multiplication), so NaN/inf there reach neither the loss nor the gradients.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import Tensor

from orchestrator.algo.kl import kl_penalty

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0  # |log ratio| bound before exp() in the policy ratio and the importance weight


def check_loss_agg(loss_agg: str, max_response_len: Optional[int]) -> None:
    """Raise ValueError for an unknown ``loss_agg`` (listing the allowed values) or, for
    ``"seq-mean-token-sum-norm"``, a missing or non-positive ``max_response_len``."""
    if loss_agg not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg: unknown value {loss_agg!r}; allowed: {list(LOSS_AGG_MODES)}")
    if loss_agg == "seq-mean-token-sum-norm" and (max_response_len is None or max_response_len <= 0):
        raise ValueError(
            "max_response_len: a positive int is required for loss_agg='seq-mean-token-sum-norm' "
            f"(Dr. GRPO), got {max_response_len!r}"
        )


def loss_normalizer(
    response_mask: Tensor, loss_agg: str, *, max_response_len: Optional[int] = None, dp_size: int = 1
) -> float:
    """Denominator ``N`` of the loss for one global batch, computed before any split.

    Contract: ``aggregate(per_token, mask, loss_agg, N, ...)`` on any micro-batch returns
    ``sum(units) / N``, a unit being a token's loss (``"token-mean"``), a sequence's token-mean loss
    (``"seq-mean-token-mean"``) or a sequence's token sum / ``max_response_len``
    (``"seq-mean-token-sum-norm"``, Dr. GRPO, Liu et al. 2025). Summing micro-batch losses on a rank and
    averaging gradients over ``dp_size`` ranks then gives exactly the un-split batch's mean over units.
    So ``N = units in global batch / dp_size``, counting response tokens, or sequences with at least one
    response token (empty sequences contribute nothing, so padding rows do not change the loss).

    Args:
        response_mask: ``[B, T]`` bool / int / float, nonzero on response tokens of the WHOLE global
            batch (all ranks, all micro-batches).
        loss_agg: ``"token-mean"``, ``"seq-mean-token-mean"`` or ``"seq-mean-token-sum-norm"``.
        max_response_len: required (> 0) for ``"seq-mean-token-sum-norm"``; checked here so that a
            misconfiguration fails before training (``aggregate`` uses it).
        dp_size: number of data-parallel ranks whose gradients are averaged, >= 1.

    Returns:
        ``N`` as a python float, > 0.

    Raises:
        ValueError: unknown ``loss_agg``, missing ``max_response_len`` for Dr. GRPO, ``dp_size < 1``,
            a mask that is not 2-D or has no response token.
    """
    check_loss_agg(loss_agg, max_response_len)
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


def masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with entries where the bool ``mask`` is False replaced by 0 (``where``: their NaN/inf and
    gradients vanish). Shapes broadcast as in ``torch.where``."""
    return torch.where(mask, x, torch.zeros_like(x))


def policy_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Importance ratio ``exp(logprobs - old_logprobs)`` per token, the log ratio clamped to [-20, 20].

    PPO, Schulman et al. 2017, eq. 6 (``r_t(theta)``). ``[B, T]`` in, ``[B, T]`` out, differentiable in
    ``logprobs``.
    """
    return torch.exp(torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic clipped surrogate as a per-token loss, and where the clipped branch is active.

    ``pg = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))``: PPO, Schulman et al. 2017,
    eq. 7 (negated: a loss); separate ``clip_low`` / ``clip_high`` is Clip-Higher (DAPO, Yu et al. 2025,
    section 3.1).

    Args:
        ratio, advantages: ``[B, T]`` float (advantages per token, masked).
        clip_low, clip_high: >= 0.
    Returns:
        ``(pg [B, T], clipped [B, T] bool)``, ``clipped`` True where the clipped branch is strictly larger
        (its gradient is 0 there): the ``actor/clip_frac`` numerator.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def dual_clip(pg: Tensor, advantages: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """Dual-clip PPO's lower bound for negative advantages, and where it is active.

    Ye et al. 2020 ("Mastering Complex Control in MOBA Games with Deep Reinforcement Learning"), eq. 5: for
    ``A < 0`` the objective is ``max(min(r A, clip(r) A), c A)``; as a loss, ``min(pg, -c A)`` with ``pg``
    the clipped surrogate loss (``clipped_surrogate``). It bounds a token's loss by ``c |A|`` however large
    its ratio (active only where ``r > c``). ``torch.where`` selects, so untouched tokens are bit for bit
    ``pg`` (and their gradient too); active tokens get gradient 0.

    Args:
        pg, advantages: ``[B, T]`` float (masked); c: > 1.
    Returns:
        ``(pg' [B, T], dual [B, T] bool)``, ``dual`` True where the bound replaced ``pg``.
    Raises:
        ValueError: ``c <= 1``.
    """
    if not c > 1:
        raise ValueError(f"dual_clip_c: must be > 1, got {c}")
    bound = -c * advantages
    dual = (advantages < 0) & (pg > bound)
    return torch.where(dual, bound, pg), dual


def importance_weight(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance weight between sampler and trainer, detached: ``min(exp(old - rollout), cap)``.

    TIS, Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training"); the
    log ratio is clamped to [-20, 20] before ``exp``. ``[B, T]`` in (masked), ``[B, T]`` out.
    """
    log_w = torch.clamp(old_logprobs - rollout_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(log_w), max=cap).detach()


def kl_term(logprobs: Tensor, ref_logprobs: Optional[Tensor], estimator: str) -> Optional[Tensor]:
    """Per-token KL(policy || reference) estimate ``[B, T]`` (``kl_penalty``: Schulman 2020's k1 / k2 / k3;
    k3 is GRPO's, Shao et al. 2024, eq. 4), or None without reference logprobs. Inputs masked."""
    return kl_penalty(logprobs, ref_logprobs, estimator) if ref_logprobs is not None else None


def add_kl(pg: Tensor, kl: Optional[Tensor], kl_coef: float) -> Tensor:
    """``pg + kl_coef * kl`` (GRPO, Shao et al. 2024, eq. 3: the KL penalty inside the loss); ``pg`` when
    there is no KL or ``kl_coef`` is 0."""
    return pg + kl_coef * kl if (kl is not None and kl_coef > 0) else pg


def aggregate(
    per_token: Tensor, mask: Tensor, loss_agg: str, normalizer: float, max_len: Optional[int]
) -> Tensor:
    """Sum of this micro-batch's units (see ``loss_normalizer``) divided by ``normalizer``: a scalar.

    Args:
        per_token: ``[B, T]`` float per-token loss; mask: ``[B, T]`` bool; loss_agg: see ``LOSS_AGG_MODES``;
        normalizer: > 0; max_len: ``max_response_len`` for ``"seq-mean-token-sum-norm"``.
    """
    seq_sum = masked(per_token, mask).sum(dim=-1)
    if loss_agg == "token-mean":
        return seq_sum.sum() / normalizer
    if loss_agg == "seq-mean-token-mean":
        count = mask.sum(dim=-1)
        seq_mean = torch.where(count > 0, seq_sum / count.clamp(min=1), torch.zeros_like(seq_sum))
        return seq_mean.sum() / normalizer
    if max_len is None:
        raise ValueError("max_response_len: required for loss_agg='seq-mean-token-sum-norm' (Dr. GRPO)")
    return (seq_sum / max_len).sum() / normalizer


@torch.no_grad()
def loss_metrics(mask: Tensor, pg: Tensor, ratio: Tensor, kl: Optional[Tensor] = None,
                 clipped: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                 extra: Optional[dict[str, Tensor]] = None) -> dict[str, float]:
    """Token means over one micro-batch's response tokens, fetched with a single device sync.

    Returns python floats: ``actor/pg_loss``, ``actor/kl`` (0.0 without ``kl``), ``actor/clip_frac``
    (mean of the bool ``clipped``; 0.0 without it), ``actor/ratio_mean``, ``actor/tokens`` (count),
    with ``weight`` ``actor/tis_weight_mean``, and the token mean of each ``extra`` tensor under its key
    (``step_metrics``). All tensors ``[B, T]``; ``mask`` bool.
    """
    count = mask.sum().to(torch.float32)
    denom = count.clamp(min=1.0)

    def mean(x: Tensor) -> Tensor:
        return masked(x.float(), mask).sum() / denom

    zero = count.new_zeros(())
    metrics = {"actor/pg_loss": mean(pg), "actor/kl": mean(kl) if kl is not None else zero,
               "actor/clip_frac": mean(clipped.float()) if clipped is not None else zero,
               "actor/ratio_mean": mean(ratio), "actor/tokens": count}
    if weight is not None:
        metrics["actor/tis_weight_mean"] = mean(weight)
    for key, x in (extra or {}).items():
        metrics[key] = mean(x)
    return dict(zip(metrics, torch.stack(list(metrics.values())).tolist()))


@torch.no_grad()
def step_metrics(logprobs: Tensor, old_logprobs: Tensor, ratio: Tensor, clipped: Optional[Tensor],
                 dual: Optional[Tensor] = None, entropy: Optional[Tensor] = None) -> dict[str, Tensor]:
    """The per-token indicators behind the metrics every loss reports (``loss_metrics(extra=...)`` averages them).

    ``actor/clip_frac_low`` / ``actor/clip_frac_high``: ``clipped`` tokens whose ``ratio`` is below / above 1
    (the side of the clip range they left); ``actor/clip_frac_dual``: ``dual`` (dual-clip PPO active; 0
    without it); ``actor/approx_kl_old``: Schulman's k3 estimate of KL(pi_old || pi) from samples of the old
    policy, ``(rho - 1) - log rho`` with ``rho = pi / pi_old`` (log ratio clamped to [-20, 20]);
    ``actor/entropy``: the policy's token entropy (only when given). All ``[B, T]``, masked inputs.
    """
    log_rho = torch.clamp(logprobs.detach() - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    flags = clipped if clipped is not None else torch.zeros_like(ratio, dtype=torch.bool)
    out = {"actor/clip_frac_low": flags & (ratio < 1), "actor/clip_frac_high": flags & (ratio > 1),
           "actor/clip_frac_dual": dual if dual is not None else torch.zeros_like(flags),
           "actor/approx_kl_old": torch.expm1(log_rho) - log_rho}
    if entropy is not None:
        out["actor/entropy"] = entropy.detach()
    return out
