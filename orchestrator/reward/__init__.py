"""Rewards for RL post-training: built-in verifiable reward functions and the process-pool scorer.

`RewardScorer` scores completions group by group with weighted reward functions under a hard
per-call timeout and a per-process memory limit; `actors/reward.py` wraps it as the `RewardActor` Ray actor.
`check_reward_failures` is the stop rule for failed calls (orchestrator/reward/failures.py).
"""

from orchestrator.reward.failures import FailureTally, TooManyFailuresError, check_reward_failures
from orchestrator.reward.functions import (
    BUILTIN_REWARDS,
    RewardFn,
    accuracy,
    boxed_format,
    extract_final_answer,
    resolve_reward_fn,
)
from orchestrator.reward.rgym import reasoning_gym_reward
from orchestrator.reward.scorer import RewardResult, RewardScorer, check_reward_values

# a reasoning-gym task's own scorer (data.source=reasoning_gym:<task>); registered here, where every import of
# orchestrator.reward.* passes, because rgym.py imports functions.py
BUILTIN_REWARDS.setdefault("reasoning_gym", reasoning_gym_reward)

__all__ = [
    "BUILTIN_REWARDS",
    "FailureTally",
    "RewardFn",
    "RewardResult",
    "RewardScorer",
    "TooManyFailuresError",
    "accuracy",
    "boxed_format",
    "check_reward_failures",
    "check_reward_values",
    "extract_final_answer",
    "reasoning_gym_reward",
    "resolve_reward_fn",
]
