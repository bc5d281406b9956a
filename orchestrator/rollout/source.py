"""The rollout-source seam: launch a batch of groups on the rollout workers, collect their trajectories.

    source = SingleTurnSource(cfg, workers, wait)       # or MultiTurnSource when env.name is set
    launched = source.launch(requests)                  # the workers' calls, not waited for
    trajs = source.collect(launched, version, row)      # wait, stale-version check, `rollout/*` metrics

The bookkeeping every source shares is written once, here: waiting through the job's bounded `wait`, the
check that every sample carries the weight version the engines held at launch (a WeightMismatchError
otherwise: no sample trains on weights other than the ones recorded for it), and the per-step metrics
common to all sources. A source adds how a batch splits into calls (`_shards`), how one call reaches its
worker (`_call`) and its own metrics (`_metrics`). A call whose worker was lost (its process died: the
job's `recover` hook replaces the worker, synced to the current weights) is issued again, with the same
groups, to the replacement; the batch's results hold each call's result once (`rollout/worker_restarts`,
`rollout/groups_reissued` in the row). The asynchronous pipeline (orchestrator/rollout/async_source.py)
wraps any source, since it only calls `launch` and `collect`. Pure: no Ray import (actor handles are passed in; `wait` is the job's).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from orchestrator.rollout.types import PromptRequest, Trajectory
from orchestrator.weight_sync import WeightMismatchError

Wait = Callable[[Any], Any]  # ray.get bounded by run.phase_timeout_s (orchestrator.job.Job.wait)
# (worker index, the error of its call) -> the replacement worker's handle (synced to the current weights),
# or None when the error is not a lost worker (then it is raised). orchestrator.job.Job.recover_rollout.
Recover = Callable[[int, BaseException], Optional[Any]]


@dataclass
class Launched:
    """One launched batch: its requests, the workers called (index per call) and their ObjectRefs;
    `results` ([(trajectories, metrics)] per call) once collected, `wait_s` the time spent waiting;
    `payloads`: each call's groups (issued again when its worker is lost); `sent_to`: the handle each call
    went to; `restarts`: workers replaced while this batch ran; `reissued`: groups issued again."""

    requests: list[PromptRequest]
    workers: list[int]
    refs: list
    results: Optional[list] = None
    wait_s: float = 0.0
    meta: dict = field(default_factory=dict)
    payloads: list = field(default_factory=list)
    sent_to: list = field(default_factory=list)
    restarts: int = 0
    reissued: int = 0


class RolloutSource:
    """Base of every rollout source (see the module docstring). `workers`: the rollout worker handles (the
    job's list: a replaced worker's new handle is set in it); `recover`: the job's hook for a lost worker
    (None: a lost worker's error is raised)."""

    window = "generate"  # the fault window of this source's calls (orchestrator/runtime/faults.py; the eval's: "eval")

    def __init__(self, cfg, workers: list, wait: Wait, recover: Optional[Recover] = None):
        self.cfg, self.wait, self.recover = cfg, wait, recover
        self.workers = workers if isinstance(workers, list) else list(workers)

    # ---- the interface ------------------------------------------------------------------------
    def launch(self, requests: list[PromptRequest]) -> Launched:
        """Submit the batch's calls to the workers; returns at once (nothing is waited for)."""
        shards = self._shards(requests)
        sent_to = [self.workers[w] for w, _ in shards]
        refs = [self._call(w, payload) for w, payload in shards]
        return Launched(requests, [w for w, _ in shards], refs, payloads=[p for _, p in shards], sent_to=sent_to)

    def fetch(self, launched: Launched) -> list:
        """Wait for the batch's calls (once); returns the workers' [(trajectories, metrics)], one per call.
        A call whose worker was lost is issued again to its replacement (`recover`); other errors, and a
        lost worker without `recover`, are raised."""
        if launched.results is None:
            t0 = time.perf_counter()
            try:
                launched.results = [self._wait_call(launched, i) for i in range(len(launched.refs))]
            finally:
                self.release(launched)
            launched.wait_s = time.perf_counter() - t0
        return launched.results

    def collect(self, launched: Launched, expected_version: int, row: dict) -> list[Trajectory]:
        """The batch's trajectories, after `fetch`. Writes `rollout/*` metrics into `row`. Raises
        WeightMismatchError when a sample's weight version is not `expected_version` (the engines'
        version at launch), RuntimeError when no trajectory came back."""
        results = self.fetch(launched)
        trajs = [t for ts, _ in results for t in ts]
        if not trajs:
            raise RuntimeError("the rollout returned no trajectory (see the rollout workers' logs)")
        stale = [t.weight_version for t in trajs if t.weight_version != expected_version]
        if stale:
            raise WeightMismatchError(f"rollout returned samples of weight version {stale[0]}, "
                                      f"expected {expected_version}")
        row.update(self._metrics(launched, trajs))
        row["rollout/worker_restarts"] = row.get("rollout/worker_restarts", 0) + launched.restarts
        row["rollout/groups_reissued"] = row.get("rollout/groups_reissued", 0) + launched.reissued
        return trajs

    def generate(self, requests: list[PromptRequest], version: int, row: dict) -> list[Trajectory]:
        """`launch` then `collect`: one synchronous batch."""
        return self.collect(self.launch(requests), version, row)

    def rewards(self, trajs: list[Trajectory], row: dict) -> Optional[list[float]]:
        """Rewards the source already has (an environment's), or None: the reward functions score them."""
        return None

    def _wait_call(self, launched: Launched, i: int):
        """The result of call `i`; while its worker is lost, the call's groups go to its replacement: the one
        `recover` starts, or the one already started since the call was sent (another batch in flight on
        the same worker found it lost first); a worker that left the job (placement.elastic: its group could not be
        placed again) has its groups go to another worker. The job's restart budget (run.max_restarts) bounds the retries."""
        while True:
            try:
                return self.wait(launched.refs[i])
            except Exception as e:  # noqa: BLE001 - `recover` tells a lost worker from other errors
                w = launched.workers[i]
                if not launched.payloads or self.recover is None:
                    raise
                if w < len(self.workers) and self.workers[w] is launched.sent_to[i]:  # not replaced since sent
                    handle = self.recover(w, e)
                    if handle is None:
                        raise
                    if w < len(self.workers):  # replaced in place (else its engine left the job: placement.elastic)
                        self.workers[w] = handle
                    launched.restarts += 1
                if w >= len(self.workers):  # the worker left the job: another one takes the call's groups
                    w = launched.workers[i] = w % len(self.workers)
                launched.sent_to[i] = self.workers[w]
                launched.refs[i] = self._call(w, launched.payloads[i])
                launched.reissued += len(launched.payloads[i])

    # ---- what a source adds -------------------------------------------------------------------
    def _shards(self, requests: list[PromptRequest]) -> list[tuple[int, Any]]:
        """[(worker index, that call's payload: its groups)] of the batch's calls."""
        raise NotImplementedError

    def _call(self, worker: int, payload) -> Any:
        """Submit one call's payload to worker `worker`; returns its ObjectRef."""
        raise NotImplementedError

    def release(self, launched: Launched) -> None:
        """The batch's calls returned or failed (a router releases its groups)."""

    def _metrics(self, launched: Launched, trajs: list[Trajectory]) -> dict:
        raise NotImplementedError
