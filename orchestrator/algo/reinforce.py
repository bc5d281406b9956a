"""REINFORCE++ and REINFORCE++-baseline: outcome advantages normalised over the GLOBAL batch (built in).

REINFORCE++, Hu 2025 ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
arXiv 2501.03262), with an outcome reward and gamma = 1: the return of every response token of
sample i is its sequence reward r_i, and the advantages are whitened over every response token of the
global batch (one baseline for the batch instead of GRPO's per-group one):

    reinforce_plus_plus:            a_i = r_i
    reinforce_plus_plus_baseline:   a_i = r_i - mean_{j in g(i)} r_j        (the group mean first)
    both:                           A_{i,t} = (a_i - mean(a)) / (std(a) + eps)

mean and unbiased std over the batch's response tokens (a sample counts once per trained token, as verl's
``masked_whiten``), eps = ``algo.adv_eps``. Outcome-only: the paper also folds a per-token KL penalty
``-beta * KL_t`` into the token rewards; here the KL stays in the loss (``algo.kl_coef``), so these are the
outcome-reward variants verl registers under the same names. Unlike the group estimators (grpo, rloo,
dr_grpo), a group whose rewards are all equal does NOT get advantages of exactly 0: the global mean is
subtracted from it too. A batch with fewer than 2 response tokens, or whose values are all equal, gets 0.
Singleton groups (rollout.n = 1 is refused by the config) are centred to 0 by the baseline variant.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from orchestrator.algo.advantages import AdvantageInputs, broadcast_to_tokens, group_stats, register_advantage_estimator


def whiten_over_tokens(values: Tensor, response_mask: Tensor, eps: float) -> Tensor:
    """``(a_i - mean) / (std + eps)`` for per-sample values ``a`` ``[B]`` over the trained tokens of ``response_mask``
    ``[B, T]``: each sample weighted by its number of trained tokens, unbiased std. Float64 math.

    Returns ``[B, T]`` float32, 0 off the mask; all 0 when the mask holds fewer than 2 tokens or std is 0.
    """
    mask = response_mask != 0
    a = values.detach().to(torch.float64)
    counts = mask.sum(dim=-1).to(torch.float64)
    n = counts.sum()
    if n < 2:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    mean = (a * counts).sum() / n
    centred = a - mean
    std = torch.sqrt((centred.square() * counts).sum() / (n - 1))
    if std == 0:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return broadcast_to_tokens((centred / (std + eps)).to(torch.float32), mask)


@register_advantage_estimator("reinforce_plus_plus")
def reinforce_plus_plus(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """REINFORCE++ (Hu 2025; outcome reward, gamma = 1): ``(r_i - mean) / (std + eps)`` over the
    global batch's response tokens. Returns ``[B, T]`` float32."""
    return whiten_over_tokens(inputs.rewards, inputs.response_mask, cfg.adv_eps)


@register_advantage_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """REINFORCE++-baseline (Hu 2025, the group-baseline variant): ``r_i - mean_g`` (the group's mean reward),
    then whitened over the global batch's response tokens as ``reinforce_plus_plus``. Returns ``[B, T]`` float32."""
    centred = group_stats(inputs.rewards, inputs.group_ids).centred
    return whiten_over_tokens(centred, inputs.response_mask, cfg.adv_eps)
