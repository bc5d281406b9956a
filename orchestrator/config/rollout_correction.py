"""The `algo.rollout_correction` section: how the loss corrects for the rollout engine's and the trainer's
probabilities differing (orchestrator/algo/mismatch.py has the equations; docs/algorithms.md why).

    algo:
      tis_cap: 2.0                 # token-level truncated IS, as before (mode none)
      rollout_correction:
        mode: token_mask           # IcePop: tokens whose ratio leaves [token_low, token_high] leave the loss
        token_low: 0.5
        token_high: 2.0

`check_rollout_correction(cfg)` checks what involves other keys (orchestrator/config/load.py calls it before
any actor starts); ranges of single fields are on the fields.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.algo.mismatch import MISMATCH_MODES, SEQUENCE_IS_MODES
from orchestrator.config.fields import choice, number


@dataclass
class RolloutCorrectionConfig:
    # none | token_mask | seq_truncate | seq_mask | geo_mask. none = algo.tis_cap alone (token-level truncated
    # IS). token_mask: IcePop token masking; seq_truncate / seq_mask: sequence-level truncated / masked IS
    # (these replace the token TIS weight); geo_mask: sequences rejected by their geometric-mean ratio.
    mode: str = choice("none", MISMATCH_MODES)
    # token_mask: a token whose ratio exp(old - rollout logprob) is outside [token_low, token_high] gets weight 0
    token_low: float = number(0.5, gt=0, le=1)
    token_high: float = number(2.0, ge=1, finite=True)
    # seq_truncate: weight min(prod of token ratios, seq_cap); seq_mask: a sequence whose product exceeds it leaves
    seq_cap: float = number(2.0, ge=1, finite=True)
    # geo_mask: a sequence leaves the loss unless exp(mean log ratio) is in [geo_low, geo_high]
    geo_low: float = number(0.999, gt=0, le=1)
    geo_high: float = number(1.001, ge=1, finite=True)


def check_rollout_correction(cfg) -> None:
    """Raise ValueError naming the key: a correction mode with ``algo.old_logprobs=rollout`` (the old logprobs
    are then the rollout's own, every ratio is 1 and the correction would silently do nothing)."""
    mode = cfg.algo.rollout_correction.mode
    if mode != "none" and cfg.algo.old_logprobs != "trainer":
        raise ValueError(f"algo.rollout_correction.mode={mode!r} needs algo.old_logprobs=trainer (the trainer's "
                         "recomputed logprobs against the rollout's); with algo.old_logprobs="
                         f"{cfg.algo.old_logprobs!r} every ratio is 1. Set algo.old_logprobs=trainer or mode none")


def corrects_staleness(cfg) -> bool:
    """Whether the loss weights the policy-gradient term by the trainer/rollout ratio (needed by async runs with
    algo.old_logprobs=trainer): algo.tis_cap set, or a sequence-level IS mode (which replaces it)."""
    return cfg.algo.tis_cap is not None or cfg.algo.rollout_correction.mode in SEQUENCE_IS_MODES
