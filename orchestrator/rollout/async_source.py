"""`placement.mode=disaggregated_async`: the in-flight batches of the one-step-off pipeline over any rollout
source (single-turn or multi-turn, orchestrator/rollout/source.py), scheduled by
`orchestrator.rollout.async_pipeline.AsyncPipeline`.

    rollouts = AsyncRollouts(source, sample, loader, cfg, start_step)  # sample(step) -> the step's PromptRequests
    rollouts.launch(step)              # start of step k: launch the batch of k + 1 (and of k when none is in flight)
    trajs = rollouts.take(step, version, row)   # the batch of step k: staleness checked, dropped + regenerated over the bound
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

from dataclasses import dataclass
from typing import Callable, Optional

from orchestrator.rollout.async_pipeline import AsyncPipeline, Ticket
from orchestrator.rollout.source import Launched, RolloutSource


@dataclass
class _Batch:
    ticket: Ticket
    loader_state: dict  # the loader before these prompts were sampled
    launched: Launched  # the source's calls; `.results` once fetched, `.wait_s` the controller's blocked wait


class AsyncRollouts:
    """In-flight generations of the async pipeline over `source` (see the module docstring).

    source: the rollout source; sample: step -> that step's PromptRequests (draws from `loader`);
    loader: the prompt loader (state_dict / load_state_dict), rewound on discard and checkpointed before
    the oldest pending batch; cfg: the run config (algo.max_staleness, trainer.total_steps)."""

    def __init__(self, source: RolloutSource, sample: Callable[[int], list], loader, cfg, start_step: int = 0):
        self.source, self.sample, self.loader = source, sample, loader
        self.pipe = AsyncPipeline(cfg.algo.max_staleness, cfg.trainer.total_steps, start_step=start_step)
        self.batches: dict[int, _Batch] = {}

    def launch(self, step: int) -> None:
        """Sample prompts and launch generation for every batch the pipeline schedules at step `step`."""
        for ticket in self.pipe.to_launch(step):
            state = self.loader.state_dict()
            requests = self.sample(ticket.step)
            self.batches[ticket.step] = _Batch(ticket, state, self.source.launch(requests))

    def take(self, step: int, version: int, row: dict) -> list:
        """The trajectories of step `step`'s batch, after the staleness check (a batch over the bound is
        dropped, counted, and regenerated with the current weights). Writes `async/*` and `rollout/*`.
        Raises WeightMismatchError when the engines stamped a version other than the expected one."""
        batch = self.batches[step]
        self._fetch(batch)
        adm = self.pipe.admit(step, version)
        if not adm.admitted:
            batch.ticket = self.pipe.regenerate(step)
            batch.launched = self.source.launch(batch.launched.requests)
            self._fetch(batch)
            adm = self.pipe.admit(step, version)
        del self.batches[step]
        trajs = self.source.collect(batch.launched, batch.ticket.weight_version, row)
        row.update(self.pipe.metrics(adm))
        row["async/overlap_s"] = 0.0
        row["rollout/queue_depth"] = len(self.batches)  # batches generated or in flight, not yet trained
        return trajs

    def finish_in_flight(self, row: dict) -> None:
        """Wait for every generation still running (call before the weight sync); sets `async/overlap_s`
        and `rollout/worker_generate_s_mean` of the generation that ran during this step."""
        hidden, wall, busy = 0.0, 0.0, []
        for batch in self.batches.values():
            if batch.launched.results is None:
                self._fetch(batch)
                seconds = [m["rollout/generate_s"] for _, m in batch.launched.results]
                wall += max(seconds)
                hidden += max(0.0, max(seconds) - batch.launched.wait_s)
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
        for batch in self.batches.values():
            if batch.launched.results is None:
                self.source.release(batch.launched)
        self.batches.clear()
        if state is not None:
            self.loader.load_state_dict(state)
        if engine_version is not None:
            self.pipe.synced(engine_version)
        return steps

    def _fetch(self, batch: _Batch) -> None:
        if batch.launched.results is None:
            self.source.fetch(batch.launched)
            self.pipe.arrived(batch.ticket.step)
