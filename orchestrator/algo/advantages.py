"""Group-relative advantage estimators for GRPO-style training (GRPO, Dr. GRPO, RLOO).

Every sample of a rollout group (the completions of one prompt) gets an advantage relative to the other
samples of its group. Groups are identified only by ``group_ids``, never by prompt content, and may be
interleaved in any order. Pure torch; no Ray, no vLLM.

Example::

    >>> compute_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([7, 7, 7]), "dr_grpo")
    tensor([-1.,  0.,  1.])
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo"]
ADVANTAGE_ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")


def _check_inputs(rewards: Tensor, group_ids: Tensor, estimator: str, eps: float) -> None:
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"estimator: unknown value {estimator!r}; allowed: {list(ADVANTAGE_ESTIMATORS)}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected a 1-D tensor [B], got shape {tuple(rewards.shape)}")
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids: expected a 1-D tensor [B], got shape {tuple(group_ids.shape)}")
    if rewards.shape != group_ids.shape:
        raise ValueError(
            f"group_ids: shape {tuple(group_ids.shape)} does not match rewards shape {tuple(rewards.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids: expected an integer dtype, got {group_ids.dtype}")
    if not torch.isfinite(rewards).all():
        bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
        raise ValueError(f"rewards: non-finite values (NaN or inf) at indices {bad}")
    if not eps >= 0.0:
        raise ValueError(f"eps: must be >= 0, got {eps}")


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    estimator: str = "grpo",
    eps: float = 1e-6,
) -> Tensor:
    """Per-sample advantages relative to the sample's rollout group.

    Args:
        rewards: ``[B]`` float, one scalar reward per sample; must be finite.
        group_ids: ``[B]`` integer (int64 usually); samples with equal ids form one group. Any order,
            e.g. interleaved ``[g1, g2, g1, g2]``. Prompt content plays no part.
        estimator: one of
            - ``"grpo"``: ``(r_i - mean_g) / (std_g + eps)`` with the unbiased std (as ``torch.std``);
              GRPO, Shao et al. 2024 (DeepSeekMath), section 4.1.2 (outcome supervision),
              the advantage used in the objective of eq. 3.
            - ``"dr_grpo"``: ``r_i - mean_g``, no std division; Dr. GRPO, Liu et al. 2025
              ("Understanding R1-Zero-Like Training: A Critical Perspective"), the
              "Dr. GRPO" objective (GRPO without the std and length normalisations).
            - ``"rloo"``: ``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g)`` (leave-one-out
              baseline); RLOO, Ahmadian et al. 2024 ("Back to Basics: Revisiting
              REINFORCE Style Optimization for RLHF"), the RLOO estimator (after Kool et al. 2019).
        eps: added to the group std for ``"grpo"``; >= 0.

    Returns:
        ``[B]`` float32 advantages. A group whose rewards are all equal (including a group of size 1)
        gets advantages of exactly 0.0, never NaN or inf, for every estimator.

    Raises:
        ValueError: non-1-D ``rewards`` / ``group_ids``, mismatched shapes, non-integer ``group_ids``,
            non-finite rewards, negative ``eps``, or an unknown ``estimator`` (the message lists the
            allowed values).
    """
    _check_inputs(rewards, group_ids, estimator, eps)
    r = rewards.detach().to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() > 0 else 0

    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    mean = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    n = count[inverse]

    group_min = torch.full((num_groups,), float("inf"), dtype=torch.float64, device=r.device)
    group_max = torch.full((num_groups,), float("-inf"), dtype=torch.float64, device=r.device)
    group_min = group_min.scatter_reduce(0, inverse, r, reduce="amin")
    group_max = group_max.scatter_reduce(0, inverse, r, reduce="amax")
    uniform = (group_min == group_max)[inverse]  # covers groups of size 1

    safe_n_minus_1 = torch.where(n > 1, n - 1, torch.ones_like(n))
    if estimator == "grpo":
        sq = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, centred**2)
        std = torch.sqrt(sq[inverse] / safe_n_minus_1)
        adv = centred / (std + eps)
    elif estimator == "dr_grpo":
        adv = centred
    else:  # rloo
        adv = n / safe_n_minus_1 * centred

    adv = torch.where(uniform, torch.zeros_like(adv), adv)
    return adv.to(torch.float32)
