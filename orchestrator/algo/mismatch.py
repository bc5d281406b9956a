"""Rollout/trainer mismatch correction: the weight the policy-gradient term gets for tokens the engine sampled.

vLLM and the trainer never compute exactly the same token probabilities (other kernels, other reduction
orders, bf16/fp8 engine weights, stale weights in async runs), so a batch the engine sampled from its policy
``mu`` is slightly off-policy for the trainer's ``pi_old``. With the per-token ratio between the trainer's
old logprobs and the rollout logprobs (log ratio clamped to [-20, 20], as the policy ratio)::

    rho_t = exp(old_logprobs_t - rollout_logprobs_t)

``algo.rollout_correction.mode`` (orchestrator/algo/config.py) chooses how the policy-gradient
term of each response token is weighted (``finish_loss`` multiplies it by the weight; the KL term is not
weighted). ``algo.tis_cap`` keeps its meaning in every mode but the sequence-level IS ones:

- ``none``: ``w_t = min(rho_t, tis_cap)`` (TIS, Yao et al. 2025), or no weight when ``tis_cap`` is null:
  exactly the loss of the releases before this module.
- ``token_mask``: IcePop (Ling team 2025, "Small Leak Can Sink a Great Ship", its masked objective):
  ``w_t = min(rho_t, tis_cap) * 1[token_low <= rho_t <= token_high]`` (``1[...]`` alone when ``tis_cap`` is
  null); with ``tis_cap >= token_high`` this is IcePop's masked token weight ``rho_t * 1[...]``.
- ``seq_truncate``: sequence-level truncated IS (Seq-TIS; Liu et al. 2025, "When Speed Kills
  Stability", rollout correction; verl ``rollout_is: sequence``): every token of sequence ``i`` gets
  ``w_i = min(prod_t rho_t, seq_cap) = exp(min(sum_t log rho_t, log seq_cap))``.
- ``seq_mask``: sequence-level masked IS (Seq-MIS, same source): ``w_i = prod_t rho_t * 1[prod_t rho_t <=
  seq_cap]``: a sequence whose ratio exceeds the cap leaves the loss, the others keep their full weight.
- ``geo_mask``: geometric-mean rejection (Geo-RS, same source): sequence ``i`` leaves the loss unless
  ``geo_low <= exp(mean_t log rho_t) <= geo_high``; the kept tokens keep ``min(rho_t, tis_cap)`` (or 1).

A masked token or sequence keeps its KL term and still counts in the loss normaliser (weight 0, as in IcePop's
objective, whose 1/|o_i| counts every token): the normaliser is computed once for the global batch before it is
split, so the loss stays micro-batch and data-parallel invariant. All weights are detached. Pure torch; no Ray,
no vLLM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from orchestrator.algo.loss_parts import LOG_RATIO_CLAMP, importance_weight, masked

MISMATCH_MODES: tuple[str, ...] = ("none", "token_mask", "seq_truncate", "seq_mask", "geo_mask")
SEQUENCE_IS_MODES: tuple[str, ...] = ("seq_truncate", "seq_mask")  # replace the token TIS weight
KEY = "algo.rollout_correction"


@dataclass(frozen=True)
class MismatchSettings:
    """The ``algo.rollout_correction`` fields (same names, same defaults), for callers without a run config."""

    mode: str = "none"
    token_low: float = 0.5
    token_high: float = 2.0
    seq_cap: float = 2.0
    geo_low: float = 0.999
    geo_high: float = 1.001


@dataclass(frozen=True)
class Correction:
    """One micro-batch's correction: ``weight`` [B, T] float (detached; None = the policy-gradient term is not
    weighted) and ``kept`` [B, T] bool (response tokens the correction leaves in the policy-gradient term)."""

    weight: Optional[Tensor]
    kept: Tensor


def settings_of(cfg: Any) -> Any:
    """``cfg.rollout_correction`` (the run's ``algo`` config or ``LossConfig``), ``MismatchSettings()`` when
    absent or None (a custom config written before this field existed)."""
    found = getattr(cfg, "rollout_correction", None)
    return found if found is not None else MismatchSettings()


def uses_rollout_logprobs(cfg: Any) -> bool:
    """Whether the loss needs the rollout logprobs: ``algo.old_logprobs == "trainer"`` and a correction on
    (``algo.tis_cap`` set, or ``algo.rollout_correction.mode`` not ``none``). With ``old_logprobs ==
    "rollout"`` the ratio is exactly 1 and there is nothing to correct."""
    on = cfg.tis_cap is not None or settings_of(cfg).mode != "none"
    return cfg.old_logprobs == "trainer" and on


def check_settings(s: Any) -> None:
    """Raise ValueError naming the ``algo.rollout_correction.*`` key: an unknown mode, ``token_low`` /
    ``geo_low`` not in (0, 1], ``token_high`` / ``geo_high`` / ``seq_cap`` not a finite number >= 1."""
    if s.mode not in MISMATCH_MODES:
        raise ValueError(f"{KEY}.mode={s.mode!r} is not allowed; choose one of {list(MISMATCH_MODES)}")
    for name in ("token_low", "geo_low"):
        value = getattr(s, name)
        if not 0 < value <= 1:
            raise ValueError(f"{KEY}.{name}={value!r} must be in (0, 1]")
    for name in ("token_high", "geo_high", "seq_cap"):
        value = getattr(s, name)
        if not (math.isfinite(value) and value >= 1):
            raise ValueError(f"{KEY}.{name}={value!r} must be a finite number >= 1")


def log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``log rho = old - rollout`` per token [B, T], clamped to [-20, 20], 0 off the bool ``mask``."""
    return masked(torch.clamp(old_logprobs - rollout_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask)


def correction(old_logprobs: Tensor, rollout_logprobs: Optional[Tensor], mask: Tensor, cfg: Any) -> Correction:
    """The mismatch correction of one micro-batch (module docstring: the equation of each mode).

    Args:
        old_logprobs: ``[B, T]`` float, the trainer's logprobs of the sampling policy (masked, detached).
        rollout_logprobs: ``[B, T]`` float, the engine's logprobs of the sampled tokens, or None (the caller
            passes them only when a correction applies: then no weight, every token kept).
        mask: ``[B, T]`` bool, the trained response tokens.
        cfg: the ``algo`` config (``tis_cap``, ``rollout_correction``) or ``LossConfig``.

    Returns:
        ``Correction``: ``weight`` None when there are no rollout logprobs, or mode ``none`` with
        ``tis_cap`` null; in mode ``none`` the weight is ``importance_weight(old, rollout, tis_cap)`` bit for
        bit (the loss before this module).

    Raises:
        ValueError: an invalid ``algo.rollout_correction`` field (``check_settings``), naming it.
    """
    s = settings_of(cfg)
    check_settings(s)
    if rollout_logprobs is None:
        return Correction(None, mask)
    rollout = masked(rollout_logprobs, mask)
    token_w = importance_weight(old_logprobs, rollout, cfg.tis_cap) if cfg.tis_cap is not None else None
    if s.mode == "none":
        return Correction(token_w, mask)
    log_rho = log_ratio(old_logprobs, rollout, mask).detach()
    if s.mode == "token_mask":
        kept = mask & (log_rho >= math.log(s.token_low)) & (log_rho <= math.log(s.token_high))
        return Correction(_keep(token_w, kept, log_rho), kept)
    seq_log = log_rho.sum(dim=-1, keepdim=True)  # log prod_t rho_t, [B, 1]
    if s.mode == "geo_mask":
        mean_log = seq_log / mask.sum(dim=-1, keepdim=True).clamp(min=1)
        seq_ok = (mean_log >= math.log(s.geo_low)) & (mean_log <= math.log(s.geo_high))
        kept = mask & seq_ok
        return Correction(_keep(token_w, kept, log_rho), kept)
    log_cap = math.log(s.seq_cap)
    seq_w = torch.exp(torch.clamp(seq_log, max=log_cap)).expand_as(log_rho)  # min(prod rho, cap), no overflow
    kept = mask & (seq_log <= log_cap) if s.mode == "seq_mask" else mask
    return Correction(torch.where(kept, seq_w, torch.zeros_like(seq_w)), kept)


def _keep(token_w: Optional[Tensor], kept: Tensor, like: Tensor) -> Tensor:
    """The token weight (1 without TIS) where ``kept``, else 0."""
    base = token_w if token_w is not None else torch.ones_like(like)
    return torch.where(kept, base, torch.zeros_like(base))


def correction_weight(old_logprobs: Tensor, rollout_logprobs: Optional[Tensor], mask: Tensor,
                      cfg: Any) -> Optional[Tensor]:
    """``correction(...).weight``: the detached [B, T] weight of the policy-gradient term, or None (no weight).
    What ``finish_loss`` (orchestrator/algo/loss.py) multiplies the policy-gradient term by."""
    return correction(old_logprobs, rollout_logprobs, mask, cfg).weight
