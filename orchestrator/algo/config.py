"""The `algo` section of the run config: the advantage estimator and policy loss by registered name (orchestrator/
algo/registry.py), the clip ranges, KL, the old logprobs and their truncated importance sampling, the issue-19 loss
keys (`PolicyLossOptions`: GSPO, CISPO, dual-clip PPO, the entropy bonus), GAE's (`GaeFields`, PPO with a critic),
`algo.rollout_correction` (the engine/trainer mismatch, orchestrator/algo/mismatch.py has the equations),
`algo.max_staleness` and DAPO's `algo.dynamic_sampling` (Yu et al. 2025, sec. 3.2; orchestrator/rollout/
dynamic_sampling.py). orchestrator/config/schema.py composes it into `Config`; the loader calls
`check_rollout_correction` and reads `corrects_staleness` for the asynchronous modes' check.

    algo:
      tis_cap: 2.0                 # token-level truncated IS, as before (rollout_correction.mode none)
      rollout_correction:
        mode: token_mask           # IcePop: tokens whose ratio leaves [token_low, token_high] leave the loss
        token_low: 0.5
        token_high: 2.0
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.algo.advantages import ADVANTAGE_ESTIMATORS
from orchestrator.algo.kl import KL_ESTIMATORS
from orchestrator.algo.loss import POLICY_LOSSES
from orchestrator.algo.loss_parts import LOSS_AGG_MODES
from orchestrator.algo.mismatch import MISMATCH_MODES, SEQUENCE_IS_MODES
from orchestrator.config.fields import choice, number
from orchestrator.rollout.dynamic_sampling import MAX_ROUNDS


@dataclass
class PolicyLossOptions:
    # GSPO's clip range of the sequence ratio s_i (algo.policy_loss gspo / gspo_token; the paper: 3e-4 / 4e-4)
    gspo_clip_low: float = number(3e-4, ge=0, finite=True)
    gspo_clip_high: float = number(4e-4, ge=0, finite=True)
    # CISPO's weight clip [1 - low, 1 + high] (algo.policy_loss cispo); null low = no lower bound (MiniMax-M1)
    cispo_clip_low: Optional[float] = number(None, ge=0, optional=True)
    cispo_clip_high: float = number(0.28, ge=0, finite=True)
    # dual-clip PPO (ppo_clip): for A < 0 the token loss is at most c * |A|; only ratios > c are touched; null = off
    dual_clip_c: Optional[float] = number(3.0, gt=1, optional=True)
    # entropy bonus: loss -= entropy_coef * token entropy (aggregated like the pg term); 0 = actor/entropy metric only
    entropy_coef: float = number(0.0, ge=0, finite=True)


@dataclass
class GaeFields:
    # GAE (algo.estimator=gae): discount gamma and lambda, each in [0, 1]. lam=1 (verl's default): the advantage
    # is the return minus V_t, unbiased however wrong the fresh critic is; lam < 1 trades bias for variance.
    gamma: float = number(1.0, ge=0, le=1)
    lam: float = number(1.0, ge=0, le=1)
    # PPO value clipping: the new value may move at most this far from the old one in the loss; null = no clip
    value_clip: Optional[float] = number(0.2, gt=0, finite=True, optional=True)


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


@dataclass
class DynamicSamplingConfig:
    # DAPO dynamic sampling: groups whose rewards are all equal are dropped and more groups generated
    # (more prompts drawn) until the step holds rollout.prompts_per_step informative groups
    enabled: bool = False
    # rounds of rollout.prompts_per_step prompts per step at most; then the step trains on what it has
    max_rounds: int = number(4, ge=1, le=MAX_ROUNDS)


@dataclass
class AlgoConfig(PolicyLossOptions, GaeFields):  # + the issue-19 loss keys and GAE's gamma, lam, value_clip (above)
    # Advantage estimator and policy loss by registered name (orchestrator/algo, docs/algorithms.md):
    # estimator grpo | rloo | dr_grpo, policy_loss ppo_clip | gspo | gspo_token | cispo, plus any registered.
    estimator: str = choice("grpo", ADVANTAGE_ESTIMATORS.names)
    policy_loss: str = choice("ppo_clip", POLICY_LOSSES.names)
    # Modules that register estimators / losses: dotted names importable by every process, or absolute
    # paths to .py files; imported by config validation and, when needed, by the trainer actor.
    plugins: list = field(default_factory=list)
    loss_agg: str = choice("token-mean", LOSS_AGG_MODES)  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    clip_low: float = number(0.2, ge=0, lt=1)  # the ratio's lower clip 1 - clip_low stays above 0
    clip_high: float = number(0.28, ge=0, finite=True)  # DAPO clip-higher
    kl_coef: float = number(0.0, ge=0, finite=True)  # > 0 starts the reference model
    kl_estimator: str = choice("k3", KL_ESTIMATORS)  # k1 | k2 | k3
    # old logprobs for the ratio: "trainer" (recomputed by the trainer; optional TIS against the
    # rollout logprobs) or "rollout" (the engine's sampled-token logprobs)
    old_logprobs: str = choice("trainer", ("trainer", "rollout"))
    tis_cap: Optional[float] = number(2.0, ge=1, optional=True)  # truncated importance sampling cap; null disables TIS
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # beyond TIS (mismatch)
    adv_eps: float = number(1e-6, ge=0, finite=True)
    # rollout.mode one_step_off / stream: the largest staleness a trained token may have (the trained policy's
    # version minus the version that sampled it; one step off-policy = 1). Older batches or groups are dropped and
    # counted, never trained. rollout.mode=sync trains at staleness 0.
    max_staleness: int = number(1, ge=0, finite=True)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)  # DAPO sec. 3.2
    overlong_filter: bool = False  # DAPO: truncated samples (finish_reason "length") leave the loss (mask 0)


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
