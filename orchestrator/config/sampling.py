"""The check across sections of DAPO's two keys, `algo.dynamic_sampling` (its fields: orchestrator/algo/config.py)
and `reward.overlong_penalty` (orchestrator/reward/config.py).

DAPO, Yu et al. 2025 ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): dynamic sampling
(section 3.2, orchestrator/rollout/dynamic_sampling.py) and overlong reward shaping (section 3.4, eq. 13,
orchestrator/reward/overlong.py). Both are off by default (a run without them is unchanged).
`check_sampling_config` checks what involves other sections (config validation calls it).
"""
from __future__ import annotations

from orchestrator.reward.overlong import overlong_max_len
from orchestrator.rollout.dynamic_sampling import ROUND_STRIDE


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
