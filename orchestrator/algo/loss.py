"""Policy losses: a registry of small functions over ``LossInputs`` (``"ppo_clip"`` built in).

A loss is ``fn(inputs: LossInputs, cfg) -> (loss, metrics)``: ``inputs`` holds the micro-batch's
``[B, T]`` tensors and the global normaliser, ``cfg`` is the run's ``algo`` config (``AlgoConfig``, or
``LossConfig`` for callers without one). It is assembled from the parts in
orchestrator/algo/loss_parts.py (ratio, clipping, importance correction, KL term, aggregation);
``algo.policy_loss`` selects one by name. The trainer calls ``compute_policy_loss``, which checks the
config once and dispatches. Adding one (docs/examples/custom_loss.py is a worked example)::

    @register_policy_loss("my_loss")
    def my_loss(inputs: LossInputs, cfg) -> tuple[Tensor, dict[str, float]]: ...

``policy_loss(...)`` keeps the keyword API with one advantage per sequence ``[B]`` for existing callers.
Pure torch; no Ray, no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from torch import Tensor

from orchestrator.algo.loss_parts import (
    LOSS_AGG_MODES, LossAgg, add_kl, aggregate, check_loss_agg, clipped_surrogate, dual_clip, kl_term,
    loss_metrics, loss_normalizer, masked, policy_ratio, step_metrics,
)
from orchestrator.algo.mismatch import MismatchSettings, correction_weight
from orchestrator.algo.registry import Registry

__all__ = ["LOSS_AGG_MODES", "POLICY_LOSSES", "LossAgg", "LossConfig", "LossInputs", "MaskedTerms", "compute_policy_loss",
           "finish_loss", "loss_normalizer", "masked_terms", "policy_loss", "ppo_clip", "register_policy_loss"]

PolicyLossFn = Callable[["LossInputs", Any], "tuple[Tensor, dict[str, float]]"]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "algo.policy_loss")


def register_policy_loss(name: str, settings: Optional[Mapping[str, Any]] = None,
                         source: str = "") -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering ``fn(inputs: LossInputs, cfg) -> (loss scalar, metrics)`` as ``algo.policy_loss=name``.

    The loss must be ``sum(units) / inputs.normalizer`` (use ``aggregate``) so that micro-batches and
    data-parallel ranks add up to the global batch's loss; metrics are python floats over this
    micro-batch's response tokens (``loss_metrics``). ``settings`` / ``source``: the ``algo`` keys that define
    the loss in its paper (``{"loss_agg": "seq-mean-token-mean"}``), used unless the user sets them
    (``Registry.register``). Raises ValueError when ``name`` is taken or the settings are malformed.
    """
    return POLICY_LOSSES.register(name, settings, source)


@dataclass(frozen=True)
class LossConfig:
    """The ``algo`` fields the built-in loss reads, for callers without a run config (same names)."""

    policy_loss: str = "ppo_clip"
    loss_agg: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    tis_cap: Optional[float] = None
    rollout_correction: MismatchSettings = MismatchSettings()  # orchestrator/algo/mismatch.py
    entropy_coef: float = 0.0
    dual_clip_c: Optional[float] = None  # off here (AlgoConfig's default is 3): the keyword API stays as it was
    gspo_clip_low: float = 3e-4
    gspo_clip_high: float = 4e-4
    cispo_clip_low: Optional[float] = None
    cispo_clip_high: float = 0.28


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's loss inputs, checked on construction.

    Attributes:
        logprobs: ``[B, T]`` float, current policy logprobs of the sampled tokens (differentiable).
        old_logprobs: ``[B, T]`` float, logprobs of the policy the advantages refer to (detached).
        advantages: ``[B, T]`` float, per response token (a per-sequence estimator repeats its value).
        mask: ``[B, T]`` bool / int / float, nonzero on trained response tokens.
        normalizer: ``loss_normalizer(global_mask, loss_agg, ..., dp_size=D)``, finite and > 0.
        max_response_len: constant divisor of ``"seq-mean-token-sum-norm"`` (Dr. GRPO).
        ref_logprobs: ``[B, T]`` reference-model logprobs (KL term), or None.
        rollout_logprobs: ``[B, T]`` sampler logprobs for the mismatch correction (TIS, or
            ``algo.rollout_correction``: orchestrator/algo/mismatch.py), or None: the caller passes them only
            when a correction applies.
        entropy: ``[B, T]`` float32 token entropy of the policy (orchestrator/algo/entropy.py), differentiable
            when ``algo.entropy_coef > 0``, or None: the ``actor/entropy`` metric and the entropy bonus.

    Raises:
        ValueError: a tensor whose shape differs from ``logprobs`` (naming it), ``logprobs`` not 2-D,
            a non-finite or non-positive ``normalizer``.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    normalizer: float
    max_response_len: Optional[int] = None
    ref_logprobs: Optional[Tensor] = None
    rollout_logprobs: Optional[Tensor] = None
    entropy: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if self.logprobs.dim() != 2:
            raise ValueError(f"logprobs: expected [B, T], got shape {tuple(self.logprobs.shape)}")
        for name in ("mask", "old_logprobs", "advantages", "ref_logprobs", "rollout_logprobs", "entropy"):
            t = getattr(self, name)
            if t is not None and t.shape != self.logprobs.shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} != logprobs shape {tuple(self.logprobs.shape)}")
        if not (math.isfinite(self.normalizer) and self.normalizer > 0):
            raise ValueError(f"normalizer: must be finite and > 0, got {self.normalizer}")


def compute_policy_loss(inputs: LossInputs, cfg: Any) -> tuple[Tensor, dict[str, float]]:
    """The registered loss ``cfg.policy_loss`` on one micro-batch: the trainer's entry point.

    Args:
        inputs: see ``LossInputs``.
        cfg: the ``algo`` config: ``policy_loss``, ``loss_agg``, ``clip_low``, ``clip_high``, ``kl_coef``,
            ``kl_estimator``, ``tis_cap`` and whatever a custom loss reads; ``plugins`` (optional) are
            imported first when ``policy_loss`` is not registered in this process (a trainer actor).

    Returns:
        ``(loss, metrics)``: a float32 scalar tensor and python floats (see the loss).

    Raises:
        ValueError: unknown ``policy_loss`` (naming ``algo.policy_loss`` and listing the registered
            names), unknown ``loss_agg`` / missing ``max_response_len``, a negative clip or ``kl_coef``,
            ``kl_coef > 0`` without ``ref_logprobs``, a non-positive ``tis_cap``, an invalid
            ``rollout_correction`` field (naming ``algo.rollout_correction.<field>``), ``entropy_coef > 0``
            without ``entropy``.
    """
    fn = POLICY_LOSSES.resolve(cfg.policy_loss, getattr(cfg, "plugins", None) or ())
    check_loss_agg(cfg.loss_agg, inputs.max_response_len)
    _check_config(cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.tis_cap, inputs.ref_logprobs)
    if getattr(cfg, "entropy_coef", 0.0) > 0 and inputs.entropy is None:
        raise ValueError("entropy: required when entropy_coef > 0 (the entropy bonus)")
    return fn(inputs, cfg)


def _check_config(clip_low: float, clip_high: float, kl_coef: float, tis_cap: Optional[float],
                  ref_logprobs: Optional[Tensor]) -> None:
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(f"clip_low / clip_high: must be >= 0, got {clip_low} / {clip_high}")
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef: must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs: required when kl_coef > 0")
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap: must be > 0, got {tis_cap}")


@register_policy_loss("ppo_clip")
def ppo_clip(inputs: LossInputs, cfg: Any) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clipping, optional KL penalty and truncated IS (GRPO's loss).

    Per response token, with ``ratio = exp(logprobs - old_logprobs)`` (log ratio clamped to [-20, 20])::

        pg = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)) * w
        loss_token = pg + kl_coef * kl_penalty(logprobs, ref_logprobs, kl_estimator)

    PPO, Schulman et al. 2017, eq. 7; GRPO, Shao et al. 2024, eq. 3; Clip-Higher, DAPO, Yu et al. 2025,
    section 3.1. Dual-clip (Ye et al. 2020, eq. 5; ``cfg.dual_clip_c``, verl's ``clip_ratio_c``; None
    disables): for ``A < 0`` the token loss is ``min(pg, -c * A)``, active only where the ratio exceeds
    ``c``, so with every ratio <= c the loss and gradient are bit for bit those without it. ``w = min(exp(old_logprobs - rollout_logprobs), tis_cap)``, detached (TIS, Yao et al.
    2025), weights only the policy-gradient term and is 1 unless ``inputs.rollout_logprobs`` and
    ``cfg.tis_cap`` are both set (``cfg.rollout_correction`` masks or replaces it: orchestrator/algo/mismatch.py). Tokens are aggregated per ``cfg.loss_agg`` and divided by
    ``inputs.normalizer``.

    Returns:
        ``(loss, metrics)``: float32 scalar; ``actor/pg_loss``, ``actor/kl``, ``actor/clip_frac`` (fraction
        where the clipped branch is strictly larger), ``actor/ratio_mean``, ``actor/tis_weight_mean``
        (TIS only), ``actor/tokens``.
    """
    t = masked_terms(inputs)
    pg, clipped = clipped_surrogate(t.ratio, t.advantages, cfg.clip_low, cfg.clip_high)
    dual = None
    if getattr(cfg, "dual_clip_c", None) is not None:
        pg, dual = dual_clip(pg, t.advantages, cfg.dual_clip_c)
    return finish_loss(pg, clipped, t, inputs, cfg, dual=dual)


@dataclass
class MaskedTerms:
    """What every policy loss starts from: the bool mask [B, T] and, zeroed off the mask, the logprobs, old
    logprobs and advantages [B, T], and the policy ratio exp(logprobs - old_logprobs) [B, T]."""

    mask: Tensor
    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    ratio: Tensor


def masked_terms(inputs: LossInputs) -> MaskedTerms:
    """The masked inputs and the policy ratio (log ratio clamped to [-20, 20], `policy_ratio`)."""
    m = inputs.mask != 0
    lp, old = masked(inputs.logprobs, m), masked(inputs.old_logprobs, m)
    return MaskedTerms(m, lp, old, masked(inputs.advantages, m), policy_ratio(lp, old))


def finish_loss(pg: Tensor, clipped: Tensor, t: MaskedTerms, inputs: LossInputs,
                cfg: Any, dual: Optional[Tensor] = None) -> tuple[Tensor, dict[str, float]]:
    """The end every policy loss shares, from its per-token policy-gradient term `pg` [B, T] and the tokens it
    counts as clipped [B, T] bool: the truncated importance weight (TIS, Yao et al. 2025: w = min(exp(old -
    rollout), tis_cap), detached, when `cfg.tis_cap` and `inputs.rollout_logprobs` are set), the KL penalty
    (`cfg.kl_coef` * `kl_penalty(..., cfg.kl_estimator)`), the aggregation (`cfg.loss_agg`, divided by
    `inputs.normalizer`), the entropy bonus (- `cfg.entropy_coef` * `inputs.entropy` per token, aggregated with
    the rest; skipped at 0) and the `actor/*` metrics, with `step_metrics`' clip sides (by `t.ratio`), dual-clip
    fraction (`dual` [B, T] bool, or None), approximate KL to the old policy and entropy. Returns (float32
    scalar loss, metrics)."""
    # TIS, or IcePop / sequence IS / geometric rejection by cfg.rollout_correction (orchestrator/algo/mismatch.py)
    weight = correction_weight(t.old_logprobs, inputs.rollout_logprobs, t.mask, cfg)
    if weight is not None:
        pg = pg * weight
    ref = masked(inputs.ref_logprobs, t.mask) if inputs.ref_logprobs is not None else None
    kl = kl_term(t.logprobs, ref, cfg.kl_estimator)
    per_token = add_kl(pg, kl, cfg.kl_coef)
    entropy = masked(inputs.entropy, t.mask) if inputs.entropy is not None else None
    if entropy is not None and getattr(cfg, "entropy_coef", 0.0) > 0:
        per_token = per_token - cfg.entropy_coef * entropy
    loss = aggregate(per_token.float(), t.mask, cfg.loss_agg, inputs.normalizer, inputs.max_response_len)
    extra = step_metrics(t.logprobs, t.old_logprobs, t.ratio, clipped, dual, entropy)
    return loss, loss_metrics(t.mask, pg, t.ratio, kl=kl, clipped=clipped, weight=weight, extra=extra)


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
    max_response_len: Optional[int] = None,
    ref_logprobs: Optional[Tensor] = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    rollout_logprobs: Optional[Tensor] = None,
    tis_cap: Optional[float] = None,
) -> tuple[Tensor, dict[str, float]]:
    """``ppo_clip`` with one advantage per sequence, keyword arguments instead of ``LossInputs`` / config.

    Args:
        logprobs, old_logprobs, mask, ref_logprobs, rollout_logprobs: ``[B, T]`` as in ``LossInputs``.
        advantages: ``[B]`` float, one advantage per sequence (repeated over its tokens).
        clip_low, clip_high, loss_agg, kl_coef, kl_estimator, tis_cap: as the ``algo`` config fields.
        normalizer, max_response_len: as in ``LossInputs``.

    Returns:
        ``ppo_clip``'s ``(loss, metrics)``, the same numbers bit for bit.

    Raises:
        ValueError: as ``compute_policy_loss``, plus ``advantages`` not ``[B]`` and ``tis_cap`` without
            ``rollout_logprobs``.
    """
    check_loss_agg(loss_agg, max_response_len)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs: expected [B, T], got shape {tuple(logprobs.shape)}")
    for name, t in {"mask": mask, "old_logprobs": old_logprobs, "ref_logprobs": ref_logprobs,
                    "rollout_logprobs": rollout_logprobs}.items():
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} != logprobs shape {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages: expected [B] = {tuple(logprobs.shape[:1])}, got shape {tuple(advantages.shape)}")
    if tis_cap is not None and rollout_logprobs is None:
        raise ValueError("rollout_logprobs: required when tis_cap is set (truncated IS)")
    inputs = LossInputs(logprobs, old_logprobs, advantages.unsqueeze(-1).expand_as(logprobs), mask, normalizer,
                        max_response_len, ref_logprobs, rollout_logprobs)
    cfg = LossConfig("ppo_clip", loss_agg, clip_low, clip_high, kl_coef, kl_estimator, tis_cap)
    return compute_policy_loss(inputs, cfg)
