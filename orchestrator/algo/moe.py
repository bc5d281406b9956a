"""Mixture-of-experts router math: the load-balancing auxiliary loss and expert-load statistics.

Pure torch (no Ray, no vLLM). The trainer collects each MoE layer's router logits (``[tokens, E]``, one
row per token of the flattened ``[b, L]`` micro-batch, as transformers' ``output_router_logits`` returns
them) and passes the attention mask, so padding tokens neither count as routed tokens nor dilute the
router probabilities (case C12)::

    aux = load_balancing_loss(router_logits, top_k=2, mask=attention_mask)
    counts, tokens = expert_token_counts(router_logits, top_k=2, mask=attention_mask)
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor


def _check(router_logits: Sequence[Tensor], top_k: int, mask: Optional[Tensor]) -> Tensor:
    """Validate the inputs; return the flat float32 mask [tokens] (all ones when `mask` is None)."""
    if len(router_logits) == 0:
        raise ValueError("router_logits: expected one [tokens, num_experts] tensor per MoE layer, got none")
    first = router_logits[0]
    for i, t in enumerate(router_logits):
        if t.dim() != 2 or t.shape != first.shape:
            raise ValueError(f"router_logits[{i}]: expected [tokens, num_experts] = {tuple(first.shape)} "
                             f"like layer 0, got shape {tuple(t.shape)}")
    num_experts = first.shape[1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k: must be in [1, num_experts={num_experts}], got {top_k}")
    if mask is None:
        return torch.ones(first.shape[0], dtype=torch.float32, device=first.device)
    flat = mask.reshape(-1).to(device=first.device, dtype=torch.float32)
    if flat.numel() != first.shape[0]:
        raise ValueError(f"mask: {tuple(mask.shape)} holds {flat.numel()} tokens, router_logits have "
                         f"{first.shape[0]} rows")
    if not bool((flat != 0).any()):
        raise ValueError("mask: no real token; the load-balancing loss is undefined")
    return (flat != 0).float()


def expert_token_counts(router_logits: Sequence[Tensor], top_k: int,
                        mask: Optional[Tensor] = None) -> tuple[Tensor, float]:
    """Top-k assignments per layer and expert over real tokens, and the number of real tokens.

    Args:
        router_logits: one ``[tokens, E]`` float tensor per MoE layer (pre-softmax router scores).
        top_k: experts each token is routed to (``num_experts_per_tok``), 1 <= top_k <= E.
        mask: ``[tokens]`` or any shape with ``tokens`` elements (e.g. the ``[b, L]`` attention mask),
            nonzero on real tokens; None = every row is a real token.

    Returns:
        ``(counts, tokens)``: ``counts`` ``[layers, E]`` float32 (no gradient), each row summing to
        ``top_k * tokens``; ``tokens`` the number of real tokens (a float). The load fraction of expert e
        in layer l is ``counts[l, e] / (top_k * tokens)``; a perfectly balanced router gives ``1 / E``.

    Raises:
        ValueError: no layer, layers of different shapes, ``top_k`` out of range, a mask whose size
            differs from the rows of the logits, or a mask without a real token.
    """
    flat = _check(router_logits, top_k, mask)
    return _counts(router_logits, top_k, flat), float(flat.sum())


def _counts(router_logits: Sequence[Tensor], top_k: int, flat: Tensor) -> Tensor:
    rows = []
    with torch.no_grad():
        for logits in router_logits:
            chosen = torch.topk(logits.float(), top_k, dim=-1).indices  # [tokens, k]
            weight = flat.unsqueeze(-1).expand_as(chosen).reshape(-1)
            rows.append(torch.zeros(logits.shape[1], dtype=torch.float32, device=flat.device)
                        .scatter_add_(0, chosen.reshape(-1), weight))
    return torch.stack(rows)


def load_balancing_loss(router_logits: Sequence[Tensor], top_k: int, mask: Optional[Tensor] = None) -> Tensor:
    """Switch-style auxiliary load-balancing loss ``E * sum_e f_e * P_e`` over real tokens only.

    Switch Transformer, Fedus et al. 2021, eq. 4-6: ``f_e`` is the fraction of tokens dispatched to
    expert e (here: top-k assignments to e per real token, so sum_e f_e = top_k, as in Mixtral / Qwen-MoE
    training code), ``P_e`` the mean router probability ``softmax(logits)[:, e]`` over real tokens.
    Both are pooled over all layers (numerators and denominators summed over layers before the
    product), exactly as transformers' ``load_balancing_loss_func`` (models/mixtral, qwen3_moe) does with
    ``attention_mask``; this function returns the same value for the same logits and mask. ``f_e`` comes
    from a top-k selection and carries no gradient; the gradient flows through ``P_e``. A perfectly
    balanced router gives ``top_k``; padding rows (mask 0) change nothing (case C12: 1.0000 masked,
    1.2263 if the two pad tokens were counted).

    Args:
        router_logits: one ``[tokens, E]`` float tensor per MoE layer (pre-softmax, differentiable).
        top_k: experts per token, 1 <= top_k <= E.
        mask: nonzero on real tokens, ``tokens`` elements in any shape (e.g. ``[b, L]``); None = all real.

    Returns:
        A float32 scalar tensor (differentiable through the router logits).

    Raises:
        ValueError: as ``expert_token_counts``.
    """
    flat = _check(router_logits, top_k, mask)
    counts, tokens = _counts(router_logits, top_k, flat), float(flat.sum())
    prob_sum = sum((torch.softmax(t.float(), dim=-1) * flat.unsqueeze(-1)).sum(dim=0) for t in router_logits)
    rows = tokens * len(router_logits)
    f = counts.sum(dim=0) / rows  # [E], sums to top_k
    p = prob_sum / rows  # [E], sums to 1
    return counts.shape[1] * torch.sum(f * p)


def expert_load_metrics(counts: Tensor) -> dict[str, float]:
    """Expert-load statistics from ``expert_token_counts`` (counts may be summed over micro-batches).

    Returns ``moe/expert_load_max``: the largest load fraction of any (layer, expert) divided by the
    ideal ``1 / E`` (1.0 = perfectly balanced, E = every token of a layer on one expert), and
    ``moe/expert_load_cv``: the coefficient of variation (population std / mean) of the per-expert
    counts within a layer, averaged over layers (0 = balanced).

    Raises:
        ValueError: ``counts`` not ``[layers, E]`` or a layer without any assignment.
    """
    if counts.dim() != 2:
        raise ValueError(f"counts: expected [layers, num_experts], got shape {tuple(counts.shape)}")
    per_layer = counts.float().sum(dim=1, keepdim=True)
    if not bool((per_layer > 0).all()):
        raise ValueError("counts: a layer has no routed token")
    frac = counts.float() / per_layer
    mean = frac.mean(dim=1)
    cv = frac.std(dim=1, unbiased=False) / mean
    return {"moe/expert_load_max": float(frac.max() * counts.shape[1]), "moe/expert_load_cv": float(cv.mean())}
