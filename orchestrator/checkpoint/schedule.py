"""When to write a checkpoint: at the last step, every `checkpoint.every_steps` steps, and after the step in
which `checkpoint.every_minutes` have passed since the last checkpoint (or since the run started or resumed).

    due = checkpoint_due(step, total_steps=100, every_steps=0, every_minutes=30.0, seconds_since_last=1900.0)

The time-based interval bounds the work a crash or preemption loses to about `every_minutes` plus one step,
whatever the step time. Pure (standard library only).
"""
from __future__ import annotations


def checkpoint_due(step: int, *, total_steps: int, every_steps: int, every_minutes: float,
                   seconds_since_last: float) -> bool:
    """Whether step `step` (1-based, just finished) ends with a checkpoint.

    Args:
        step: the step just finished.
        total_steps: the run's last step (always checkpointed).
        every_steps: a checkpoint every this many steps; 0 = off.
        every_minutes: a checkpoint once this many minutes have passed since the last one; 0 = off.
        seconds_since_last: wall seconds since the last checkpoint (or the run's start or resume).
    """
    if step == total_steps or (every_steps > 0 and step % every_steps == 0):
        return True
    return every_minutes > 0 and seconds_since_last >= every_minutes * 60.0
