"""The load-time check of fully asynchronous training with partial rollouts (`rollout.partial_rollout`,
orchestrator/rollout/stream_source.py): the engines stream without pause and weight updates interrupt them.

    check_partial_rollout(cfg)   # ValueError naming the keys
"""
from __future__ import annotations


def check_partial_rollout(cfg) -> None:
    """rollout.partial_rollout=true needs placement.mode=disaggregated_async (separate engines that generate while
    the trainer trains) and algo.max_staleness >= 1 (k: the groups generated ahead). Single-turn and multi-turn
    tasks (env.name set: every policy turn streams, actors/rollout/stream_episodes.py) both run in this mode.

    Raises ValueError naming the keys."""
    if not cfg.rollout.partial_rollout:
        return
    if cfg.placement.mode != "disaggregated_async":
        raise ValueError(f"rollout.partial_rollout=true needs placement.mode=disaggregated_async (got "
                         f"{cfg.placement.mode!r}): the engines generate while the trainer trains")
    if cfg.algo.max_staleness < 1:
        raise ValueError("rollout.partial_rollout=true needs algo.max_staleness >= 1 (got 0): k is how many policy "
                         "versions a streamed sample may lag the trainer")
