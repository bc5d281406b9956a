"""The clipped value loss of PPO's critic and its metrics (pure torch; no Ray).

PPO (Schulman et al. 2017), value clipping as in OpenAI baselines ``ppo2`` and verl's
``compute_value_loss``, per response token::

    V_clip   = V_old + clamp(V - V_old, -eps, eps)
    loss_t   = 0.5 * max((V - R)^2, (V_clip - R)^2)

with R the GAE returns (orchestrator/algo/gae.py) and ``eps = algo.value_clip`` (None: no clipping, plain
``0.5 * (V - R)^2``). Aggregated like the policy loss (``aggregate`` with ``algo.loss_agg`` and a normaliser
of the whole global batch, so micro-batches add up to the batch's loss).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from orchestrator.algo.loss_parts import aggregate, masked


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, value_clip: Optional[float],
                       loss_agg: str, normalizer: float, max_len: Optional[int] = None) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss over one micro-batch (module docstring).

    Args:
        values: ``[B, T]`` float, the critic's current values (differentiable).
        old_values: ``[B, T]`` float, the values the returns were computed with (detached).
        returns: ``[B, T]`` float, the targets R = A + V_old.
        mask: ``[B, T]``, nonzero on the trained response tokens.
        value_clip: eps > 0, or None for no clipping.
        loss_agg, normalizer, max_len: as the policy loss (``aggregate``, ``loss_normalizer``).
    Returns:
        ``(loss, metrics)``: float32 scalar; ``critic/value_loss`` (token mean of loss_t),
        ``critic/vf_clip_frac`` (fraction of tokens where the clipped branch is strictly larger),
        ``critic/values_mean``, ``critic/tokens``.
    Raises:
        ValueError: shapes that differ, a non-positive ``value_clip``.
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape):
        raise ValueError(f"values / old_values / returns / mask: shapes differ: {tuple(values.shape)} / "
                         f"{tuple(old_values.shape)} / {tuple(returns.shape)} / {tuple(mask.shape)}")
    if value_clip is not None and not value_clip > 0:
        raise ValueError(f"algo.value_clip: must be > 0 or null, got {value_clip}")
    m = mask != 0
    v, old, ret = masked(values.float(), m), masked(old_values.float(), m), masked(returns.float(), m)
    unclipped = (v - ret) ** 2
    if value_clip is None:
        per_token, clipped = 0.5 * unclipped, torch.zeros_like(m)
    else:
        v_clip = old + torch.clamp(v - old, -value_clip, value_clip)
        clipped_sq = (v_clip - ret) ** 2
        per_token, clipped = 0.5 * torch.maximum(unclipped, clipped_sq), clipped_sq > unclipped
    loss = aggregate(per_token, m, loss_agg, normalizer, max_len)
    with torch.no_grad():
        count = m.sum().float()
        denom = count.clamp(min=1.0)
        stats = torch.stack([masked(per_token, m).sum() / denom, masked(clipped.float(), m).sum() / denom,
                             v.sum() / denom, count])
    keys = ("critic/value_loss", "critic/vf_clip_frac", "critic/values_mean", "critic/tokens")
    return loss, dict(zip(keys, stats.tolist()))


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens (``critic/explained_var``): 1 = the critic predicts the
    returns, 0 = no better than their mean, < 0 worse. NaN-free: 0.0 when Var(R) is 0 or no token is masked."""
    m = mask != 0
    if int(m.sum()) < 2:
        return 0.0
    r, v = returns[m].to(torch.float64), values[m].to(torch.float64)
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return 0.0
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


def explained_variance_over(values: Tensor, returns: Tensor, all_sum: Callable[[list], list]) -> float:
    """`explained_variance` of 1-D `values` and `returns` (the masked tokens) split over data-parallel ranks:
    `all_sum` adds a list of floats over the ranks (collective; the identity with one process). Two passes
    (the global means, then the squared deviations from them), float64. 0.0 when fewer than 2 tokens or
    Var(R) = 0 in all."""
    r = returns.to(torch.float64)
    d = r - values.to(torch.float64)
    n, sum_r, sum_d = all_sum([float(r.numel()), float(r.sum()), float(d.sum())])
    if n < 2:
        return 0.0
    var_r, var_d = all_sum([float(((r - sum_r / n) ** 2).sum()), float(((d - sum_d / n) ** 2).sum())])
    if var_r == 0.0:
        return 0.0
    return 1.0 - var_d / var_r
