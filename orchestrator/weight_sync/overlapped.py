"""Weight syncs overlapped with the next step (`weight_sync.overlap`, streaming runs: rollout.mode=stream).

A synchronous sync keeps the trainer idle while every engine loads the new weights, is verified and is probed
(`sync/seconds` + `sync/probe_s`: 1.2 s of a 13 s step in benchmarks/RESULTS.md). Here the controller waits only
for the trainer's send; the engines load, report their checksums and score the probe while the trainer trains
the next step, and the controller verifies them as their calls return (`pump`, between its waits on the train
step: orchestrator/runtime/overlap.py), or at the latest when the next sync starts. Slime and AReaL likewise send weights
without stopping the trainer.

Nothing is sampled on unverified weights: each engine's stream is held before its load and released only once
that engine is verified (orchestrator/weight_sync/syncer.py `start`, `finish_each`). An engine that fails
verification stays held until the next sync, which sends it full weights and probes it; more than
`weight_sync.retries` failures of one engine in a row raise the last WeightMismatchError (the run stops, as
after a synchronous sync's retries). An engine lost during an overlapped sync is reported by the next `start`
as EnginesLost (its caller, orchestrator/job.py, replaces it and starts again); `forget(k)` drops an engine
replaced meanwhile, `renumber(old, new)` follows one that changed index (an elastic run's engine leaving).

    syncs = OverlappedSyncs(syncer, retries=cfg.weight_sync.retries)
    row.update(syncs.start(version))   # the previous sync settled first (its sync/* metrics), then this one sent
    syncs.pump()                       # while the trainer trains: verify and release what has returned
    syncs.settle(keep=True)            # before eval uses the engines: its metrics go to the next start's row
    row.update(syncs.settle())         # before a re-placement, the end of the run
"""
from __future__ import annotations

from typing import Optional

from orchestrator.runtime.faults import EnginesLost
from orchestrator.weight_sync import WeightMismatchError


class OverlappedSyncs:
    """At most one overlapped sync in flight over a `WeightSyncer` (module docstring)."""

    def __init__(self, syncer, retries: int):
        self.syncer, self.retries = syncer, retries
        self.pending = None  # syncer.PendingSync started and not settled
        self.settled: dict = {}  # the sync/* metrics of a sync settled by `pump`, until `start` or `settle` hands them on
        self.strikes: dict[int, int] = {}  # engine -> verifications failed in a row
        self.lost: dict[int, str] = {}  # engine -> why, lost during a settled sync and not replaced yet

    def start(self, version: int) -> dict:
        """Settle the sync in flight, then start the sync to `version` (returns when the trainer has sent it).
        Returns the settled sync's `sync/*` metrics (its version as `sync/verified_version`) with this one's
        `sync/version` and `sync/send_s`. Raises EnginesLost (nothing
        started) for engines lost in the settled sync: replace them, then call again; WeightMismatchError past
        weight_sync.retries failures of an engine in a row; NonFiniteWeightsError, TimeoutError from the send."""
        metrics = self.settle()
        if self.lost:
            lost, self.lost = self.lost, {}
            raise EnginesLost(lost)
        if "sync/version" in metrics:
            metrics["sync/verified_version"] = metrics.pop("sync/version")
        self.pending = self.syncer.start(version)
        return {**metrics, "sync/version": version, "sync/send_s": self.pending.send_s}

    def pump(self) -> None:
        """Settle the sync in flight if every call of it has returned (does not wait)."""
        if self.pending is not None and self.syncer.ready(self.pending):
            self.settled = self._finish()

    def settle(self, keep: bool = False) -> dict:
        """Wait for the sync in flight (up to weight_sync.timeout_s) and verify it. Returns the `sync/*` metrics of
        the sync settled since the last call ({} when none); keep=True: returns {} and keeps them for the next
        `start` (a mid-run settle, before eval: they land in the next step's row). Raises WeightMismatchError past
        the retries."""
        if self.pending is not None:
            self.settled = self._finish()
        if keep:
            return {}
        metrics, self.settled = self.settled, {}
        return metrics

    def forget(self, engine: int) -> None:
        """Engine `engine` was replaced (a fresh actor): its calls in flight and its strikes no longer count."""
        if self.pending is not None:
            self.pending.loads.pop(engine, None)
            self.pending.probes.pop(engine, None)
        self.strikes.pop(engine, None)
        self.lost.pop(engine, None)

    def renumber(self, old: int, new: int) -> None:
        """Engine `old` is engine `new` now (placement.elastic: the last engine takes a leaving one's index, which was
        `forget`-ed first): its calls in flight, strikes and loss follow it."""
        if self.pending is not None:
            for calls in (self.pending.loads, self.pending.probes):
                if old in calls:
                    calls[new] = calls.pop(old)
        for state in (self.strikes, self.lost):
            if old in state:
                state[new] = state.pop(old)

    def _finish(self) -> dict:
        pending, self.pending = self.pending, None
        metrics, failed, lost = self.syncer.finish_each(pending)
        for i in pending.loads:
            self.strikes[i] = self.strikes.get(i, 0) + 1 if i in failed else 0
        self.lost.update(lost)
        worst: Optional[int] = max(failed, key=lambda i: self.strikes[i], default=None)
        if worst is not None and self.strikes[worst] > self.retries:
            raise WeightMismatchError(f"{failed[worst]} ({self.strikes[worst]} overlapped syncs in a row failed "
                                      f"verification, weight_sync.retries={self.retries})")
        metrics["sync/failures"] = len(failed)
        return metrics
