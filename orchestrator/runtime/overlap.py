"""Work done while the controller waits for an actor call: `Job.wait(refs, pump=...)` calls `pump()` between short
waits on `refs` until they are ready, within the call's one timeout (run.phase_timeout_s). Fully asynchronous
training (orchestrator/rollout/stream_source.py) pumps while the trainer trains: it drains the engines' finished
samples and issues the scoring of the groups they complete (orchestrator/rollout/group_scores.py), so that most
groups are scored by the time the next batch is taken.

    left = pump_until(lambda wait_s: refs_ready(refs, wait_s), pump, timeout_s)  # seconds of timeout_s left
    ray.get(refs, timeout=left)  # 0 left: GetTimeoutError unless ready

Pure except `refs_ready`, which imports Ray when it is called.
"""
from __future__ import annotations

import time
from typing import Callable

PUMP_WAIT_S = 0.2  # how long one wait on the refs lasts between two pumps (a ready ref ends it at once)


def pump_until(done: Callable[[float], bool], pump: Callable[[], None], timeout_s: float,
               wait_s: float = PUMP_WAIT_S) -> float:
    """Alternate `done(w)` (wait up to w seconds, w <= `wait_s`; True when the awaited calls are ready) and `pump()`
    until `done` is True or `timeout_s` seconds have passed (a pump that runs past the deadline is not cut short).
    Returns the seconds of `timeout_s` left, >= 0 (0: the time is up; the caller's bounded get raises then).
    Raises ValueError for timeout_s < 0 or wait_s <= 0; whatever `pump` or `done` raise."""
    if timeout_s < 0 or wait_s <= 0:
        raise ValueError(f"pump_until: timeout_s={timeout_s} must be >= 0 and wait_s={wait_s} > 0")
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return 0.0
        if done(min(wait_s, left)):
            return max(deadline - time.monotonic(), 0.0)
        pump()


def refs_ready(refs, wait_s: float) -> bool:
    """Whether every Ray ObjectRef of `refs` (one ref or a list) is ready, waiting up to `wait_s` seconds."""
    import ray

    many = list(refs) if isinstance(refs, (list, tuple)) else [refs]
    if not many:
        return True
    ready, _ = ray.wait(many, num_returns=len(many), timeout=wait_s)
    return len(ready) == len(many)
