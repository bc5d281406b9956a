"""What a placement mode changes in the step: colocated time-slicing of the rollout engines.

In `placement.mode=colocated` the trainer ranks, the rollout engines and the reference share devices
(orchestrator/placement/plan.py). The engines hold device memory (weights + KV cache) that the trainer
needs while it trains, so the controller calls two hooks:

    ... generate -> reward -> reference -> [time_slice "train": engines sleep(level=1)] -> train
        -> [time_slice "weight_sync": engines wake_up(["weights"])] -> weight sync -> next generate
        (each engine wakes its KV cache itself before generating, actors/rollout/sleep_state.py)

This is the hybrid-engine order of verl and OpenRLHF (`--vllm.enable_sleep`). On CPU vLLM has no sleep mode and the
engine calls do nothing, but the calls are made and recorded in the same order. In the disaggregated modes the hooks
do nothing. Engines that placement.elastic adds to a colocated run have placement groups of their own (no trainer
rank on their devices): they neither sleep nor wake (`shares_device`).

The sleep/wake wall time lands in `colocate/sleep_s` and `colocate/wake_s` of the step's row (inside the
train and weight_sync phase timers).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import ray

from orchestrator.placement.plan import shares_device
from orchestrator.runtime.faults import EnginesLost, call_engine, gather_engines

SLEEP_LEVEL = 1  # vLLM: weights to host memory, KV cache dropped (level 2 would drop the weights: no delta sync)


def time_slice(job, phase: str, row: dict) -> None:
    """Hook before `phase` ("train" or "weight_sync") of a step of `job` (orchestrator.job.Job); a no-op
    unless placement.mode=colocated. Only the engines that share devices with trainer ranks sleep and wake
    (`shares_device`; an engine placement.elastic added has a group of its own and stays awake).

    Raises ValueError for another phase name; an engine's own error (e.g. a load into a sleeping engine) is
    raised; a lost engine is replaced (`on_every_engine`)."""
    if job.cfg.placement.mode != "colocated":
        return
    t0 = time.perf_counter()
    sharing = _sharing(job)
    if phase == "train":
        on_every_engine(job, "sleep", "sleep_engine", SLEEP_LEVEL, only=sharing)
        row["colocate/sleep_s"] = time.perf_counter() - t0
    elif phase == "weight_sync":
        on_every_engine(job, "wake", "wake_engine", ["weights"], only=sharing)
        row["colocate/wake_s"] = time.perf_counter() - t0
    else:
        raise ValueError(f"time_slice phase={phase!r}: use 'train' or 'weight_sync'")


def _sharing(job) -> Callable[[int], bool]:
    """Whether rollout worker k (its slot now) shares its devices with trainer ranks."""
    return lambda k: shares_device(job.cfg, job.actors.plan.slots["rollout"][k])


def on_every_engine(job, window: str, method: str, *args, only: Optional[Callable[[int], bool]] = None) -> list:
    """Every rollout worker's `method(*args)` (orchestrator/runtime/faults.py `call_engine` in `window`), each within
    run.phase_timeout_s; `only(k)`: call worker k only when true. A worker lost or hung in the call is replaced
    (`job.replace_rollout`: synced to the current weights) and called again; an engine that leaves the job instead
    (placement.elastic) is not, and the one that takes its index is called if it has not answered. Returns the results
    of the workers called, in worker order. Raises RestartsExhausted past run.max_restarts, RuntimeError for a strategy
    that cannot take a new engine (naming it)."""
    workers, done = job.actors.rollout, {}  # k -> (the handle that answered, its result)

    def todo() -> list[int]:  # not answered yet, by handle: an engine moved to another index answered already
        return [k for k in range(len(workers))
                if (only is None or only(k)) and not any(h is workers[k] for h, _ in done.values())]

    while todo():
        refs = {k: call_engine(workers, k, window, method, *args) for k in todo()}
        called = {k: workers[k] for k in refs}
        try:
            answered = gather_engines(refs, job.cfg.run.phase_timeout_s, method, "run.phase_timeout_s")
        except EnginesLost as e:
            answered = e.answered
            done.update({k: (called[k], v) for k, v in answered.items()})
            for k in sorted(e.engines, reverse=True):  # the highest first: an engine that leaves takes the last's place
                if k < len(workers) and workers[k] is called[k]:
                    job.replace_rollout(k, e.reasons[k])
            continue
        done.update({k: (called[k], v) for k, v in answered.items()})
    results = {id(h): v for h, v in done.values()}
    return [results[id(w)] for w in workers if id(w) in results]


def sleep_events(workers) -> list[list]:
    """Every engine's recorded sleep/wake/load/generate calls, in order (for tests and debugging)."""
    return ray.get([w.sleep_events.remote() for w in workers])
