"""The rollout-source seam: launch a batch of groups on the rollout workers, collect their trajectories.

    source = SingleTurnSource(cfg, workers, wait)       # or MultiTurnSource when env.name is set
    launched = source.launch(requests)                  # the workers' calls, not waited for
    trajs = source.collect(launched, version, row)      # wait, stale-version check, `rollout/*` metrics

The bookkeeping every source shares is written once, here: waiting through the job's bounded `wait`, the
check that every sample carries the weight version the engines held at launch (a WeightMismatchError
otherwise: no sample trains on weights other than the ones recorded for it), and the per-step metrics
common to all sources. A source adds how its requests reach the workers (`_calls`) and its own metrics
(`_metrics`). The asynchronous pipeline (orchestrator/rollout/async_source.py) wraps any source, since it only
calls `launch` and `collect`. Pure: no Ray import (actor handles are passed in; `wait` is the job's).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from orchestrator.rollout.types import PromptRequest, Trajectory
from orchestrator.weight_sync import WeightMismatchError

Wait = Callable[[Any], Any]  # ray.get bounded by run.phase_timeout_s (orchestrator.job.Job.wait)


@dataclass
class Launched:
    """One launched batch: its requests, the workers called (index per call) and their ObjectRefs;
    `results` ([(trajectories, metrics)] per call) once collected, `wait_s` the time spent waiting."""

    requests: list[PromptRequest]
    workers: list[int]
    refs: list
    results: Optional[list] = None
    wait_s: float = 0.0
    meta: dict = field(default_factory=dict)


class RolloutSource:
    """Base of every rollout source (see the module docstring). `workers`: the rollout worker handles."""

    def __init__(self, cfg, workers: list, wait: Wait):
        self.cfg, self.workers, self.wait = cfg, list(workers), wait

    # ---- the interface ------------------------------------------------------------------------
    def launch(self, requests: list[PromptRequest]) -> Launched:
        """Submit the batch's calls to the workers; returns at once (nothing is waited for)."""
        calls = self._calls(requests)
        refs = [ref for _, ref in calls]
        return Launched(requests, [w for w, _ in calls], refs)

    def fetch(self, launched: Launched) -> list:
        """Wait for the batch's calls (once); returns the workers' [(trajectories, metrics)]."""
        if launched.results is None:
            t0 = time.perf_counter()
            try:
                launched.results = self.wait(launched.refs)
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
        return trajs

    def generate(self, requests: list[PromptRequest], version: int, row: dict) -> list[Trajectory]:
        """`launch` then `collect`: one synchronous batch."""
        return self.collect(self.launch(requests), version, row)

    def rewards(self, trajs: list[Trajectory], row: dict) -> Optional[list[float]]:
        """Rewards the source already has (an environment's), or None: the reward functions score them."""
        return None

    # ---- what a source adds -------------------------------------------------------------------
    def _calls(self, requests: list[PromptRequest]) -> list[tuple[int, Any]]:
        """[(worker index, ObjectRef)] of the batch's calls."""
        raise NotImplementedError

    def release(self, launched: Launched) -> None:
        """The batch's calls returned or failed (a router releases its groups)."""

    def _metrics(self, launched: Launched, trajs: list[Trajectory]) -> dict:
        raise NotImplementedError
