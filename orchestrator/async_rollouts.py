"""Controller side of `placement.mode=disaggregated_async`: the in-flight generation calls (Ray ObjectRefs)
of the one-step-off pipeline, scheduled by `orchestrator.async_pipeline.AsyncPipeline`.

    rollouts = AsyncRollouts(controller)
    rollouts.launch(step)              # start of step k: launch the batch of k + 1 (and of k when none is in flight)
    trajs = rollouts.take(step, row)   # the batch of step k: staleness checked, dropped + regenerated over the bound
    ... reward, reference, advantages, train on it ...
    rollouts.finish_in_flight(row)     # wait for the k + 1 generation BEFORE the weight sync
    ... sync_weights(k) ...; rollouts.synced(k)

The engines generate batch k + 1 with the weights they hold (version k - 1) while the trainer trains
step k. The controller waits for that generation to return before it starts weight sync k, so no sync
ever lands inside a generation on any engine (this holds whatever the actors' concurrency; Ray's
in-order execution of one caller's calls on a default actor would order them as well).

Row keys (batch trained at step k): `async/staleness`, `async/weight_version`, `async/max_staleness_seen`,
`async/dropped_batches`; `async/generate_s`: the generation that ran during step k (batch k + 1, the
slowest worker's own generate seconds; the generation cost in this mode, hidden or not); `async/overlap_s`:
the part of it hidden behind step k's reward, reference, advantages and train phases, i.e. those
seconds minus the controller's wait for it. `timing/generate_s` in this
mode is the controller's wait for generation during the step: for the batch of k when it was not ready
(step 1, a regenerated batch) plus the exposed remainder of the k + 1 generation before the sync.
`rollout/*` metrics describe the batch trained; `rollout/worker_generate_s_mean` (for the rollout role's
busy time) is the generation that ran during the step.

Checkpoints: `loader_state()` is the prompt loader's state before the oldest batch not trained yet was
sampled, so a resume samples those prompts again and regenerates them with the checkpoint's weights: an
in-flight batch is discarded on resume, never half-applied.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from orchestrator.async_pipeline import AsyncPipeline, Ticket


@dataclass
class _Batch:
    ticket: Ticket
    requests: list
    loader_state: dict  # the loader before these prompts were sampled
    refs: list
    results: Optional[list] = None  # the workers' (trajectories, metrics), once fetched
    wait_s: float = 0.0  # the controller's blocked wait for it


class AsyncRollouts:
    """In-flight generations of the async pipeline for one `GRPOController` (see the module docstring)."""

    def __init__(self, controller):
        self.ctl = controller
        cfg = controller.cfg
        self.pipe = AsyncPipeline(cfg.algo.max_staleness, cfg.trainer.total_steps, start_step=controller.start_step)
        self.batches: dict[int, _Batch] = {}

    def launch(self, step: int) -> None:
        """Sample prompts and launch generation for every batch the pipeline schedules at step `step`."""
        for ticket in self.pipe.to_launch(step):
            state = self.ctl.loader.state_dict()
            requests = self.ctl.sample_prompts(ticket.step)
            self.batches[ticket.step] = _Batch(ticket, requests, state, self.ctl._launch_generate(requests))

    def take(self, step: int, row: dict) -> list:
        """The trajectories of step `step`'s batch, after the staleness check (a batch over the bound is
        dropped, counted, and regenerated with the current weights). Writes `async/*` and `rollout/*`.
        Raises WeightMismatchError when the engines stamped a version other than the expected one."""
        batch = self.batches[step]
        self._fetch(batch)
        adm = self.pipe.admit(step, self.ctl.version)
        if not adm.admitted:
            ticket = self.pipe.regenerate(step)
            batch.ticket, batch.refs, batch.results = ticket, self.ctl._launch_generate(batch.requests), None
            self._fetch(batch)
            adm = self.pipe.admit(step, self.ctl.version)
        del self.batches[step]
        trajs = self.ctl._collect_generate(batch.results, batch.ticket.weight_version, row)
        row.update(self.pipe.metrics(adm))
        row["async/overlap_s"] = 0.0
        row["rollout/queue_depth"] = len(self.batches)  # batches generated or in flight, not yet trained
        return trajs

    def finish_in_flight(self, row: dict) -> None:
        """Wait for every generation still running (call before the weight sync); sets `async/overlap_s`
        and `rollout/worker_generate_s_mean` of the generation that ran during this step."""
        hidden, wall, busy = 0.0, 0.0, []
        for batch in self.batches.values():
            if batch.results is None:
                self._fetch(batch)
                seconds = [m["rollout/generate_s"] for _, m in batch.results]
                wall += max(seconds)
                hidden += max(0.0, max(seconds) - batch.wait_s)
                busy.append(sum(seconds) / len(seconds))
        row["async/overlap_s"] = row.get("async/overlap_s", 0.0) + hidden
        row["async/generate_s"] = wall  # the whole generation (slowest worker), hidden or not
        row["rollout/worker_generate_s_mean"] = sum(busy)  # 0 on the last step: nothing was generated during it

    def synced(self, version: int) -> None:
        """Weight sync `version` reached every engine (no generation may be in flight)."""
        self.pipe.synced(version)

    def loader_state(self) -> Optional[dict]:
        """The loader state a checkpoint must store: before the oldest untrained batch's prompts were
        sampled; None when no batch is pending (the loader's own state is right then)."""
        if not self.batches:
            return None
        return self.batches[min(self.batches)].loader_state

    def discard(self, engine_version: Optional[int] = None) -> list[int]:
        """Drop every pending batch (engines restarted or re-placed, holding `engine_version` when given)
        and rewind the loader so their prompts are sampled again; results of calls still running are
        ignored. Returns the discarded steps (counted in `async/dropped_batches`)."""
        state = self.loader_state()
        steps = self.pipe.discard()
        self.batches.clear()
        if state is not None:
            self.ctl.loader.load_state_dict(state)
        if engine_version is not None:
            self.pipe.synced(engine_version)
        return steps

    def _fetch(self, batch: _Batch) -> None:
        if batch.results is None:
            t0 = time.perf_counter()
            batch.results = self.ctl._get(batch.refs)
            batch.wait_s = time.perf_counter() - t0
            self.pipe.arrived(batch.ticket.step)
