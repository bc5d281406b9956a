"""The `reward` section of the run config: the weighted reward functions, their limits, an optional learned
reward model and DAPO's overlong penalty (Yu et al. 2025, eq. 13; orchestrator/reward/overlong.py); `check_reward_section`
resolves every function now, so that a typo fails before any actor starts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.config.fields import number


@dataclass
class OverlongPenaltyConfig:
    # DAPO soft overlong punishment (eq. 13), added to the reward: 0 up to max_len - cache_len response
    # tokens, linear down to -factor at max_len, -factor beyond
    enabled: bool = False
    max_len: int = number(0, ge=0, finite=True, note="(0 = rollout.max_new_tokens)")  # L_max, tokens
    cache_len: int = number(16, gt=0, finite=True)  # L_cache, tokens: the length of the linear ramp
    factor: float = number(1.0, ge=0, finite=True)  # the penalty's scale (1 = the paper's)


@dataclass
class RewardFunctionConfig:
    name: str = "accuracy"  # built-in name ("accuracy", "boxed_format") or "pkg.module:function"
    weight: float = 1.0


@dataclass
class RewardConfig:
    functions: list = field(default_factory=lambda: [RewardFunctionConfig()])
    timeout_s: float = number(10.0, gt=0)  # hard per-group limit; a timeout scores 0 and is counted
    num_workers: int = number(2, gt=0)  # scorer processes
    # MiB of writable memory per scorer process (RLIMIT_DATA); past it the call fails alone. 0 = no limit.
    memory_limit_mb: int = number(4096, ge=0)
    # The run stops when more than this fraction of a step's reward calls fail (time out, raise, run out
    # of memory); each failed call scores 0 for its function and group. 1.0 = never stop, 0.0 = on any failure.
    max_failed_frac: float = number(0.5, ge=0, le=1)
    # Optional learned reward: a local HF sequence-classification folder; its score is added with weight.
    model_path: Optional[str] = None
    model_weight: float = number(1.0, finite=True)
    model_batch_size: int = number(8, gt=0)  # sequences per forward of the reward model
    overlong_penalty: OverlongPenaltyConfig = field(default_factory=OverlongPenaltyConfig)  # DAPO eq. 13


def check_reward_section(cfg) -> None:
    """reward.functions: at least one, no name twice, finite weights, each name a built-in or an importable
    "pkg.module:function" (orchestrator/reward/functions.py).
    Raises ValueError naming the key; orchestrator/config/load.py `validate` calls it (as ConfigError)."""
    from orchestrator.reward.functions import resolve_reward_fn

    if not cfg.reward.functions:
        raise ValueError("reward.functions is empty; give at least one {name, weight}")
    names = [f.name for f in cfg.reward.functions]
    if len(set(names)) != len(names):
        raise ValueError(f"reward.functions has duplicate names: {names}")
    for i, f in enumerate(cfg.reward.functions):
        if not math.isfinite(f.weight):
            raise ValueError(f"reward.functions[{i}].weight={f.weight!r} must be finite")
        try:
            resolve_reward_fn(f.name)
        except ValueError as e:
            raise ValueError(f"reward.functions[{i}].name: {e}") from None
