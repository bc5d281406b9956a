"""Sleep/wake bookkeeping of one rollout engine (colocated placement: the engine and the trainer take turns).

On GPUs vLLM's sleep mode frees the device for the trainer: `LLM.sleep(level=1)` moves the weights to host
memory and drops the KV cache; `LLM.wake_up(tags=["weights"])` brings the weights back (a weight sync can
then write into them) and `wake_up(tags=["kv_cache"])` re-allocates the KV cache (vLLM 0.32,
vllm/entrypoints/llm.py; the staged wake is verl's, PR #729, so weights + KV + trainer never peak together).
On CPU vLLM has no sleep mode (its CPU worker ignores it), so the engine calls are no-ops, but this class
still tracks the state and records every call, so the order is tested on CPU:

    sleep(1) -> wake_up(["weights"]) -> load weights -> wake_up(["kv_cache"]) (lazily, at the next generate)

A weight load into a sleeping engine or a generate on one raises RuntimeError: the controller's order is wrong.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

AWAKE, ASLEEP, WEIGHTS_ONLY = "awake", "asleep", "weights"


class SleepState:
    """State machine over an engine with `sleep(level)` and `wake_up(tags)`; `events` keeps the last 256
    calls as (name, argument) tuples: ("sleep", 1), ("wake_up", ["weights"]), ("load", method), ("generate", what)."""

    def __init__(self, engine):
        self.engine = engine
        self.state = AWAKE
        self.events: deque = deque(maxlen=256)

    def sleep(self, level: int = 1) -> None:
        """Put the engine to sleep (level 1: weights offloaded, KV cache dropped; vLLM's levels)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level={level!r}: use 1 (weights to host memory) or 2 (weights dropped)")
        self.events.append(("sleep", level))
        if self.state != ASLEEP:
            self.engine.sleep(level)
        self.state = ASLEEP

    def wake_up(self, tags: Optional[list] = None) -> None:
        """Wake all (tags None) or part: ["weights"], then ["kv_cache"]. Raises ValueError on an unknown tag."""
        tags = list(tags) if tags is not None else None
        if tags is not None and not set(tags) <= {"weights", "kv_cache"}:
            raise ValueError(f"wake_up tags={tags!r}: allowed are 'weights' and 'kv_cache'")
        self.events.append(("wake_up", tags))
        if self.state == AWAKE:
            return
        self.engine.wake_up(tags)
        if tags is None or "kv_cache" in tags and (self.state == WEIGHTS_ONLY or "weights" in tags):
            self.state = AWAKE
        elif "weights" in tags:
            self.state = WEIGHTS_ONLY

    def ensure_weights_awake(self, what: str) -> None:
        """Before a weight load: raises RuntimeError if the weights are asleep."""
        if self.state == ASLEEP:
            raise RuntimeError(f"{what}: the rollout engine is asleep (weights in host memory); the controller must "
                               "call wake_engine(['weights']) before a weight sync")
        self.events.append(("load", what))

    def ensure_awake(self, what: str) -> None:
        """Before generating: wakes the KV cache after a staged wake; raises RuntimeError if still asleep."""
        if self.state == ASLEEP:
            raise RuntimeError(f"{what}: the rollout engine is asleep; the controller must wake it (and sync the "
                               "weights) before generating")
        if self.state == WEIGHTS_ONLY:
            self.wake_up(["kv_cache"])
        self.events.append(("generate", what))
