"""Advantage estimators: a registry of small functions, per token ``[B, T]`` (GRPO, Dr. GRPO, RLOO built in).

An estimator receives the batch's rewards ``[B]``, rollout group ids ``[B]`` and response mask ``[B, T]``
(and, for per-token estimators, token rewards / values ``[B, T]``) as ``AdvantageInputs`` plus the
``algo`` config, and returns advantages ``[B, T]``. A per-sequence estimator computes one value per
sample and broadcasts it over the sample's response tokens (``broadcast_to_tokens``). Groups are
identified only by ``group_ids``, never by prompt content, in any order (case C04). Pure torch; no Ray,
no vLLM. Adding one::

    @register_advantage_estimator("my_estimator")
    def my_estimator(inputs: AdvantageInputs, cfg) -> Tensor:   # -> [B, T]
        return broadcast_to_tokens(inputs.rewards - 0.5, inputs.response_mask)

Example::

    >>> compute_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([7, 7, 7]), "dr_grpo")
    tensor([-1.,  0.,  1.])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from torch import Tensor

from orchestrator.algo.registry import Registry

AdvantageEstimatorFn = Callable[["AdvantageInputs", Any], Tensor]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimatorFn] = Registry("advantage estimator", "algo.estimator")
# the built-in names (REINFORCE++ in orchestrator/algo/reinforce.py); the registry may hold more
AdvantageEstimator = Literal["grpo", "rloo", "dr_grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def register_advantage_estimator(name: str, settings: Optional[Mapping[str, Any]] = None,
                                 source: str = "") -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Decorator registering ``fn(inputs: AdvantageInputs, cfg) -> Tensor [B, T]`` as ``algo.estimator=name``.

    ``cfg`` is the run's ``algo`` config (``AlgoConfig``; ``AdvantageConfig`` through ``compute_advantages``):
    read ``cfg.adv_eps`` and any other field from it. ``settings`` / ``source``: the ``algo`` keys that define
    the estimator's method in its paper, used unless the user sets them (``Registry.register``). Raises
    ValueError when ``name`` is taken or the settings are malformed.
    """
    return ADVANTAGE_ESTIMATORS.register(name, settings, source)


@dataclass(frozen=True)
class AdvantageConfig:
    """The ``algo`` fields the built-in estimators read, for callers without a run config."""

    adv_eps: float = 1e-6


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator sees; checked on construction.

    Attributes:
        rewards: ``[B]`` float, one finite scalar reward per sample (the sequence reward).
        group_ids: ``[B]`` integer; samples with equal ids form one rollout group (any order).
        response_mask: ``[B, T]`` bool / int / float, nonzero on the response tokens that are trained.
        token_rewards: optional ``[B, T]`` float per-token rewards (per-token estimators).
        values: optional ``[B, T]`` float critic values (GAE-style estimators).

    Raises:
        ValueError: a wrong rank or shape (naming the field), non-integer ``group_ids`` or non-finite rewards.
    """

    rewards: Tensor
    group_ids: Tensor
    response_mask: Tensor
    token_rewards: Optional[Tensor] = None
    values: Optional[Tensor] = None

    def __post_init__(self) -> None:
        _check_sequence_inputs(self.rewards, self.group_ids)
        b = tuple(self.rewards.shape)
        if self.response_mask.dim() != 2 or tuple(self.response_mask.shape[:1]) != b:
            raise ValueError(f"response_mask: expected [B, T] with B = {b[0]}, got shape {tuple(self.response_mask.shape)}")
        for name in ("token_rewards", "values"):
            t = getattr(self, name)
            if t is not None and t.shape != self.response_mask.shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} != response_mask shape {tuple(self.response_mask.shape)}")


def _check_sequence_inputs(rewards: Tensor, group_ids: Tensor) -> None:
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


def compute_token_advantages(estimator: str, inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """Advantages per response token by the registered ``estimator``: the entry point of the controller.

    Args:
        estimator: a name in ``ADVANTAGE_ESTIMATORS`` (``algo.estimator``).
        inputs: the batch, see ``AdvantageInputs``.
        cfg: the ``algo`` config passed to the estimator (reads ``adv_eps`` for the built-ins); its
            ``plugins`` (optional) are imported first when ``estimator`` is not registered yet.

    Returns:
        ``[B, T]`` float32; exactly 0.0 where ``response_mask`` is 0.

    Raises:
        ValueError: unknown ``estimator`` (naming ``algo.estimator`` and listing the registered names),
            an estimator returning another shape or a non-finite value.
    """
    fn = ADVANTAGE_ESTIMATORS.resolve(estimator, getattr(cfg, "plugins", None) or ())
    adv = fn(inputs, cfg)
    if adv.shape != inputs.response_mask.shape:
        raise ValueError(f"algo.estimator={estimator!r} returned shape {tuple(adv.shape)}, expected [B, T] = "
                         f"{tuple(inputs.response_mask.shape)}")
    mask = inputs.response_mask != 0
    adv = torch.where(mask, adv.detach().to(torch.float32), torch.zeros((), dtype=torch.float32, device=adv.device))
    if not torch.isfinite(adv).all():
        raise ValueError(f"algo.estimator={estimator!r} returned non-finite advantages on response tokens")
    return adv


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    estimator: str = "grpo",
    eps: float = 1e-6,
) -> Tensor:
    """Per-sample advantages ``[B]`` of a per-sequence estimator (one response token per sample).

    Same numbers as ``compute_token_advantages`` on each response token; kept for callers that want one
    value per sample.

    Args:
        rewards: ``[B]`` float, one scalar reward per sample; must be finite.
        group_ids: ``[B]`` integer (int64 usually); samples with equal ids form one group. Any order,
            e.g. interleaved ``[g1, g2, g1, g2]``. Prompt content plays no part.
        estimator: a registered per-sequence estimator: ``"grpo"``, ``"rloo"``, ``"dr_grpo"`` (see each).
        eps: added to the group std for ``"grpo"``; >= 0.

    Returns:
        ``[B]`` float32 advantages. A group whose rewards are all equal (including a group of size 1)
        gets advantages of exactly 0.0, never NaN or inf, for every built-in group estimator (grpo, rloo,
        dr_grpo; the REINFORCE++ estimators, orchestrator/algo/reinforce.py, whiten over the whole batch).

    Raises:
        ValueError: non-1-D ``rewards`` / ``group_ids``, mismatched shapes, non-integer ``group_ids``,
            non-finite rewards, negative ``eps``, or an unknown ``estimator`` (the message lists the
            allowed values).
    """
    if not eps >= 0.0:
        raise ValueError(f"eps: must be >= 0, got {eps}")
    ADVANTAGE_ESTIMATORS.get(estimator)  # an unknown name fails before the inputs are looked at
    mask = torch.ones(rewards.shape[:1] + (1,), dtype=torch.bool, device=rewards.device)
    inputs = AdvantageInputs(rewards, group_ids, mask)
    return compute_token_advantages(estimator, inputs, AdvantageConfig(adv_eps=eps))[:, 0]


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """One advantage per sample ``[B]`` copied onto its response tokens: ``[B, T]``, 0 where the mask is 0.

    The values are copied, not recomputed, so every token of a sample carries its sample's value bit for bit.
    """
    adv = advantages.unsqueeze(-1).expand(response_mask.shape)
    return torch.where(response_mask != 0, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))


@dataclass(frozen=True)
class GroupStats:
    """Per-sample views of its group's statistics, float64 (see ``group_stats``).

    centred: ``r_i - mean_g``; count: ``n_g``; n_minus_1: ``max(n_g - 1, 1)`` (safe divisor);
    uniform: True where every reward of the group is equal (including groups of size 1);
    sq_sum: ``sum_{j in g} (r_j - mean_g)^2``.
    """

    centred: Tensor
    count: Tensor
    n_minus_1: Tensor
    uniform: Tensor
    sq_sum: Tensor


def group_stats(rewards: Tensor, group_ids: Tensor) -> GroupStats:
    """Vectorised group statistics (``index_add_`` / ``scatter_reduce``; no Python loop over groups).

    Args:
        rewards: ``[B]`` float (used in float64); group_ids: ``[B]`` integer.
    Returns:
        ``GroupStats`` with ``[B]`` float64 tensors (``uniform`` bool).
    """
    r = rewards.detach().to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() > 0 else 0
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=r.device)
    count = zeros.clone().index_add_(0, inverse, torch.ones_like(r))
    mean = zeros.clone().index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    n = count[inverse]
    group_min = torch.full((num_groups,), float("inf"), dtype=torch.float64, device=r.device)
    group_max = torch.full((num_groups,), float("-inf"), dtype=torch.float64, device=r.device)
    group_min = group_min.scatter_reduce(0, inverse, r, reduce="amin")
    group_max = group_max.scatter_reduce(0, inverse, r, reduce="amax")
    uniform = (group_min == group_max)[inverse]
    sq_sum = zeros.clone().index_add_(0, inverse, centred**2)[inverse]
    return GroupStats(centred, n, torch.where(n > 1, n - 1, torch.ones_like(n)), uniform, sq_sum)


def _finish(adv: Tensor, stats: GroupStats, mask: Tensor) -> Tensor:
    """Uniform groups exactly 0 (``where``, not arithmetic), cast to float32, broadcast over the mask."""
    adv = torch.where(stats.uniform, torch.zeros_like(adv), adv)
    return broadcast_to_tokens(adv.to(torch.float32), mask)


@register_advantage_estimator("grpo")
def grpo(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """``(r_i - mean_g) / (std_g + eps)``, unbiased std (as ``torch.std``), ``eps = cfg.adv_eps``.

    GRPO, Shao et al. 2024 (DeepSeekMath), section 4.1.2 (outcome supervision), the advantage of the
    objective in eq. 3. Returns ``[B, T]`` float32, each sample's value on its response tokens.
    """
    s = group_stats(inputs.rewards, inputs.group_ids)
    std = torch.sqrt(s.sq_sum / s.n_minus_1)
    return _finish(s.centred / (std + cfg.adv_eps), s, inputs.response_mask)


@register_advantage_estimator("rloo")
def rloo(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g)`` (leave-one-out baseline).

    RLOO, Ahmadian et al. 2024 ("Back to Basics: Revisiting REINFORCE Style Optimization for RLHF"),
    after Kool et al. 2019. Returns ``[B, T]`` float32.
    """
    s = group_stats(inputs.rewards, inputs.group_ids)
    return _finish(s.count / s.n_minus_1 * s.centred, s, inputs.response_mask)


@register_advantage_estimator("dr_grpo", {"loss_agg": "seq-mean-token-sum-norm"},
                              "Dr. GRPO, Liu et al. 2025 ('Understanding R1-Zero-Like Training'): token sums over a constant")
def dr_grpo(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """``r_i - mean_g``, no std division.

    Dr. GRPO, Liu et al. 2025 ("Understanding R1-Zero-Like Training: A Critical Perspective"), the
    "Dr. GRPO" objective (GRPO without the std and length normalisations). Returns ``[B, T]`` float32.
    """
    s = group_stats(inputs.rewards, inputs.group_ids)
    return _finish(s.centred, s, inputs.response_mask)


def sequence_abs_mean(advantages: Tensor, response_mask: Tensor) -> float:
    """Mean over samples of each sample's token-mean ``|A|``: ``actor/advantage_abs_mean``.

    For a per-sequence estimator this is exactly the mean of ``|A_i|`` over samples (the token mean of
    copies is computed in float64, where it is exact). Samples without a trained token are left out;
    0.0 when none has one.

    Args:
        advantages: ``[B, T]`` float; response_mask: ``[B, T]``, nonzero on trained tokens.
    """
    m = response_mask != 0
    count = m.sum(dim=-1)
    keep = count > 0
    if not bool(keep.any()):
        return 0.0
    per_seq = torch.where(m, advantages.abs().to(torch.float64), torch.zeros((), dtype=torch.float64)).sum(dim=-1)
    return float((per_seq[keep] / count[keep]).to(advantages.dtype).mean())
