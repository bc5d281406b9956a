"""DAPO's sampling and reward sections of the run config: `algo.dynamic_sampling`, `reward.overlong_penalty`.

DAPO, Yu et al. 2025 ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): dynamic sampling
(section 3.2, orchestrator/rollout/dynamic_sampling.py) and overlong reward shaping (section 3.4, eq. 13,
orchestrator/reward/overlong.py). Both are off by default (a run without them is unchanged).
`check_sampling_config` checks what involves other sections (config validation calls it).
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.fields import number
from orchestrator.reward.overlong import overlong_max_len
from orchestrator.rollout.dynamic_sampling import MAX_ROUNDS, ROUND_STRIDE



@dataclass
class DynamicSamplingConfig:
    # DAPO dynamic sampling: groups whose rewards are all equal are dropped and more groups generated
    # (more prompts drawn) until the step holds rollout.prompts_per_step informative groups
    enabled: bool = False
    # rounds of rollout.prompts_per_step prompts per step at most; then the step trains on what it has
    max_rounds: int = number(4, ge=1, le=MAX_ROUNDS)


@dataclass
class OverlongPenaltyConfig:
    # DAPO soft overlong punishment (eq. 13), added to the reward: 0 up to max_len - cache_len response
    # tokens, linear down to -factor at max_len, -factor beyond
    enabled: bool = False
    max_len: int = number(0, ge=0, finite=True, note="(0 = rollout.max_new_tokens)")  # L_max, tokens
    cache_len: int = number(16, gt=0, finite=True)  # L_cache, tokens: the length of the linear ramp
    factor: float = number(1.0, ge=0, finite=True)  # the penalty's scale (1 = the paper's)


def check_sampling_config(cfg) -> None:
    """Raises ValueError naming the keys: dynamic sampling with too many group ids for ROUND_STRIDE; an overlong
    penalty whose cache_len exceeds max_len, or set for a multi-turn run (env.name). Dynamic sampling runs in every
    rollout.mode (orchestrator/rollout/dynamic_sampling.py)."""
    ds, op = cfg.algo.dynamic_sampling, cfg.reward.overlong_penalty
    if ds.enabled and (cfg.trainer.total_steps + 1) * cfg.rollout.prompts_per_step >= ROUND_STRIDE:
        raise ValueError(f"algo.dynamic_sampling: trainer.total_steps * rollout.prompts_per_step must stay below "
                         f"{ROUND_STRIDE} (the group-id stride of the extra rounds)")
    if op.enabled and op.cache_len > overlong_max_len(cfg):
        raise ValueError(f"reward.overlong_penalty.cache_len={op.cache_len} exceeds its max_len "
                         f"({overlong_max_len(cfg)}; 0 = rollout.max_new_tokens)")
    if op.enabled and cfg.env.name:
        raise ValueError("reward.overlong_penalty is single-turn only (env.name is set: multi-turn episodes are bounded "
                         "by env.max_tokens and env.max_turns); turn it off")
