"""The size of the last optimizer update relative to the weights before it, ||delta theta||_2 / ||theta_old||_2
(`actor/update_ratio`), recomputed from AdamW's state after the step: no copy of the weights.

An exploding update names divergence at the first update (a learning rate of 0.5 typed for 5e-7 moves every
weight by ~0.5 on AdamW's first step, where the weights' RMS is ~0.05), before the weights reach an engine and a
probe mismatch points at the weight sync (guards.update_ratio_max, orchestrator/guards/signals.py).

torch's AdamW step t (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", alg. 2; torch.optim.AdamW):

    p_mid = p_old (1 - lr wd)
    u     = lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)        m, v: exp_avg, exp_avg_sq after the step
    p_new = p_mid - u

so p_old = (p_new + u) / (1 - lr wd) and delta = p_new - p_old = -(u + lr wd p_old): exact up to float rounding
(sums in float64 across tensors), one temporary the size of the largest parameter, about 0.2 s per update of the
default model on 2 CPU cores. Plain torch, no Ray.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from actors.trainer.finite import local_shard

SumSquares = Callable[[dict[str, float]], dict[str, float]]  # sums over data-parallel ranks (their shards)


def _same(sums: dict[str, float]) -> dict[str, float]:
    return sums


def _group_sums(group: dict, state) -> tuple[float, float]:
    """(sum of squares of the update AdamW just applied to `group`'s parameters, sum of squares of those parameters
    before it), over this rank's shards. Per stepped parameter w (after the step) one temporary q = m_hat /
    (sqrt(v_hat) + eps) (u = lr q) and three dot products: with k = 1 - lr wd, p_old = (w + u) / k, so
    ||p_old||^2 = (ww + 2 uw + uu) / k^2 and ||delta||^2 = ||u + lr wd p_old||^2 = uu + 2 lr wd (uw + uu) / k
    + (lr wd)^2 ||p_old||^2."""
    lr, (b1, b2), eps, wd = float(group["lr"]), group["betas"], float(group["eps"]), float(group["weight_decay"])
    decay = lr * wd
    keep = 1.0 - decay if decay < 1.0 else 1.0  # decay >= 1: p_old unrecoverable; p_new + u stands in
    update_sq = before_sq = 0.0
    with torch.no_grad():
        for p in group["params"]:
            s, w = state.get(p, {}), local_shard(p)
            ww = float(torch.linalg.vecdot(w.flatten(), w.flatten())) if w.numel() else 0.0
            if "exp_avg" not in s:  # not stepped: unchanged
                before_sq += ww
                continue
            t = float(s["step"])
            q = local_shard(s["exp_avg_sq"]).sqrt().div_(math.sqrt(1.0 - b2 ** t)).add_(eps)
            torch.div(local_shard(s["exp_avg"]), q, out=q)
            step = lr / (1.0 - b1 ** t)
            qq, qw = float(torch.linalg.vecdot(q.flatten(), q.flatten())), float(torch.linalg.vecdot(q.flatten(), w.flatten()))
            uu, uw = step * step * qq, step * qw
            old_sq = (ww + 2.0 * uw + uu) / (keep * keep)
            before_sq += old_sq
            update_sq += uu + 2.0 * decay * (uw + uu) / keep + decay * decay * old_sq
    return update_sq, before_sq


def update_ratio(optimizer: torch.optim.Optimizer, sum_ranks: SumSquares = _same) -> Optional[float]:
    """||delta theta||_2 / ||theta_old||_2 of the AdamW step just taken (float, dimensionless; theta_old: the weights
    before it), over every parameter of every rank (`sum_ranks` sums the shards' squares across data-parallel ranks;
    identity on one process). None for any optimizer other than torch.optim.AdamW (or with amsgrad), whose update
    cannot be recomputed from its state; inf when the old weights' norm is 0 and the update's is not."""
    if type(optimizer) is not torch.optim.AdamW or any(g.get("amsgrad") for g in optimizer.param_groups):
        return None
    sums = [_group_sums(g, optimizer.state) for g in optimizer.param_groups]
    total = sum_ranks({"update_sq": sum(u for u, _ in sums), "weight_sq": sum(b for _, b in sums)})
    if total["weight_sq"] > 0:
        return math.sqrt(total["update_sq"] / total["weight_sq"])
    return 0.0 if total["update_sq"] == 0 else math.inf
