"""Fully asynchronous rollouts (`rollout.mode=stream`): the
engines generate continuously, the trainer takes a batch as soon as `rollout.prompts_per_step` groups are
complete, and a weight sync interrupts the requests in flight, which continue on the new weights
(partial rollouts: actors/rollout/stream.py on the workers, orchestrator/rollout/partial.py per sample).
One of the rollout pipelines of orchestrator/rollout/pipeline.py (`RolloutPipeline`), as the controller's step calls it:

    rollouts = StreamRollouts(workers, wait, sample, loader, cfg, start_step)
    rollouts.launch(step)                     # top the engines up to the capacity rule (k = algo.max_staleness)
    trajs = rollouts.take(step, version, row) # waits for prompts_per_step complete admissible groups
    scores = rollouts.scores(row)             # their rewards and reference logprobs, scored per group (or None)
    ... advantages, train: job.wait(train ref, pump=rollouts.pump) ...
    rollouts.finish_in_flight(row)            # nothing to wait for: the sync interrupts the engines
    ... sync_weights(step) ...; rollouts.synced(step)
    trajs = rollouts.more(step, r, version, row, groups)   # algo.dynamic_sampling: `groups` more complete groups

Prompts are drawn from the loader a batch (prompts_per_step groups) at a time while the capacity rule of
`GroupBuffer` (orchestrator/rollout/stream_buffer.py) allows a whole batch: at most (version + k + 1) batches
started (up to k + 1 batches of work ahead of the trainer). Until the first batch of a run is taken it is generated
alone (k + 1 batches sharing the engines made the first step wait for all: benchmarks/RESULTS.md); the k batches
ahead start as soon as it is taken. Groups go to the worker with the fewest samples outstanding and are trained in
the order they complete; one whose oldest token is more than k versions older than the policy trained is dropped
(counted) and its slot refilled. While the trainer waits, each worker runs the groups its batch still needs before
any other (`stream_prioritize`: benchmarks/RESULTS.md). Submits are not waited for, and a batch already complete is
taken without a call to the workers: a weight load queued on them (weight_sync.overlap) does not hold the step.

Scoring is pipelined per group (orchestrator/rollout/group_scores.py): each group is scored as soon as it is
complete in the buffer (every drain issues the reward actor's call for the groups it completed, and, with a
reference actor, their reference logprobs), and the controller drains while the trainer trains (`pump`, through
`Job.wait`: orchestrator/runtime/overlap.py), so the groups completing then are scored before their batch is taken; the
step waits only for the calls still running (`stream/score_wait_s`). Multi-turn groups keep the environment's
rewards (reference logprobs only). The reward failure policy, overlong penalty and reward/* stay per batch.

Checkpoints (`state_dict`): the requests of every group not trained yet, the loader after them, the counters
and, single-turn, the generation state exactly (orchestrator/rollout/stream_state.py: each worker hands over its
finished samples not drained yet and copies of its unfinished ones; a resume continues them on the checkpoint's
weights, so no sample is lost or trained twice and the tokens trained are the ones the checkpoint held).
Multi-turn runs and older checkpoints (requests only) regenerate every untrained group from its request with the
checkpoint's weights: nothing lost or trained twice, but the tokens differ.

A lost rollout worker (in any call: orchestrator/runtime/faults.py `call_engine`; the job's `recover` hook replaces it,
synced to the current weights, or the weight sync did) loses its groups: every incomplete group assigned to it
is issued again, whole, to the replacement (same requests and seeds; `rollout/worker_restarts`,
`rollout/groups_reissued`). Past run.max_restarts the hook raises and the run stops. The workers' side (where each
group runs, every call, the reissue) is orchestrator/rollout/stream_workers.py.

Multi-turn tasks (`env.name` set) stream the same way: a group is n episodes on the worker's agent loop
(actors/rollout/stream_episodes.py), each policy turn a partial sample on the streaming engine; a finished group
comes back as `EpisodeSample`s (orchestrator/rollout/partial_episode.py), staleness from their oldest sampled
token, so the buffer and its rules are the ones above. Rewards are the environment's; failures follow the
non-streaming multi-turn source (orchestrator/rollout/multi_turn_source.py: an env error ends its episode, a failed
make/reset fills its slot untrained, env/* keys per batch, env.max_failed_frac stops the run with
TooManyFailuresError, a batch with no trajectory at all raises RuntimeError).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from orchestrator.rollout.group_scores import BatchScores, GroupScores, Issue
from orchestrator.rollout.multi_turn_source import check_env_failures, env_failures, no_trajectory_error
from orchestrator.rollout.partial import PartialSample
from orchestrator.rollout.partial_episode import batch_env_tally, episode_metrics
from orchestrator.rollout.resume_mode import STREAM, check_written_by
from orchestrator.rollout.source import Recover
from orchestrator.rollout.stream_buffer import DUE_WAIT_S, GroupBuffer
from orchestrator.rollout.stream_state import STATE_KEYS, generation_state, restore_plan
from orchestrator.rollout.stream_workers import StreamWorkers
from orchestrator.rollout.types import PromptRequest, Trajectory

POLL_S = 0.2  # how long one drain call waits on a worker for a finished sample
# a worker's `stream/<kind>_s` (actors/rollout/stream.py) -> `rollout/worker_<name>_s_mean`, the mean over the workers
ENGINE_KEYS = {f"stream/{k}_s": {"busy": "generate"}.get(k, k) for k in ("busy", "held", "empty", "blocked", "add")}


class StreamRollouts:
    """Controller side of fully asynchronous rollouts (see the module docstring).

    workers: the job's rollout worker handles (its list: a replacement's handle is set in it); wait: the job's
    bounded ray.get; sample: step -> one batch of PromptRequests from `loader`; cfg: the run config
    (algo.max_staleness, rollout.prompts_per_step, rollout.n); recover: the job's hook for a lost worker (None:
    its error is raised); score_group: starts one complete group's reward and reference calls (None: nothing is
    scored per group); on_poll: called before every drain of the workers (weight_sync.overlap: `Job.pump_sync`)."""

    def __init__(self, workers: list, wait: Callable, sample: Callable[[int], list], loader, cfg, start_step: int = 0,
                 recover: Optional[Recover] = None, env_cfg: Optional[dict] = None,
                 score_group: Optional[Issue] = None, on_poll: Optional[Callable[[], None]] = None):
        self.on_poll = on_poll  # before every drain: the job's overlapped weight sync verified as it returns
        self.wait, self.sample, self.loader = wait, sample, loader
        self.env_cfg = env_cfg  # multi-turn tasks: the `env` section of episodes
        self.per_step, self.n = cfg.rollout.prompts_per_step, cfg.rollout.n
        # where each group runs, every worker call, a lost worker's groups issued again (orchestrator/rollout/stream_workers.py)
        self.engines = StreamWorkers(workers, wait, recover, self._restart_group, env_cfg, self.n)
        self.max_tokens = cfg.rollout.max_new_tokens  # a restored group's samples not started (`restore_plan`)
        self.buffer = GroupBuffer(cfg.algo.max_staleness, self.per_step)
        self.buffer.started = start_step * self.per_step  # a resume: the groups trained before count as started
        self.version = start_step
        self.requests: dict[int, PromptRequest] = {}  # group id -> request, every group started and not trained
        self.batches_drawn = start_step  # the loader's batches drawn so far (the step number of the next draw)
        self.engine_s, self.stream = dict.fromkeys(ENGINE_KEYS, 0.0), {}  # drains summed; a worker's last stream/*
        # a batch was taken: until then one batch at a time (`_first_batch_alone`), at the start of a run only (a
        # resume continues as the uninterrupted run would: its checkpoint holds the batches ahead)
        self.taken = start_step > 0
        self.actor_restarts: Optional[float] = None  # env actors replaced since the last batch (env.placement=actor)
        self.group_scores = GroupScores(score_group, wait) if score_group is not None else None
        self.taken_scores: Optional[list] = None  # the last batch's groups' calls, until `scores` waits for them

    def launch(self, step: int) -> None:
        """Start whole batches while the capacity rule allows (the loader draws one batch per call)."""
        while self.buffer.capacity(self.version) >= self.per_step and not self._first_batch_alone():
            self.batches_drawn += 1
            self.submit(self.sample(self.batches_drawn))

    def _first_batch_alone(self) -> bool:
        """Before the first batch is taken, no more groups start while a whole batch is untrained."""
        return not self.taken and len(self.buffer.pending) + len(self.buffer.ready) >= self.per_step

    def submit(self, requests: list[PromptRequest]) -> None:
        """Hand groups to the least-loaded workers (also used by a resume for the checkpoint's groups)."""
        self.engines.reissue_replaced()  # a replaced worker gets its own groups first (not these twice)
        for r in requests:
            self.buffer.submit(r.group_id, self.engines.size(r))
            self.requests[r.group_id] = r
        self.engines.assign(requests)

    def _restart_group(self, group_id: int) -> Optional[PromptRequest]:
        """A lost worker's group `group_id`, if still in flight: its finished samples forgotten; its request."""
        if group_id not in self.buffer.pending:
            return None
        self.buffer.restart(group_id)
        return self.requests[group_id]

    def take(self, step: int, version: int, row: dict, groups: Optional[int] = None) -> list[Trajectory]:
        """The trajectories of the first `groups` (default prompts_per_step) complete admissible groups (waits for
        them; dropped groups' slots are refilled meanwhile). Writes `async/*`, `rollout/*` and `stream/*` into `row`."""
        self.version, count = version, groups or self.per_step
        t0 = time.perf_counter()
        if self.engines.failed:  # a worker call failed while the trainer trained: replaced now
            self._poll(0.0)
        self._score_ready()  # groups a checkpoint's snapshot or a resume put into the buffer
        batch = self.buffer.take(count, version)  # drained while the trainer trained: no worker call
        while batch is None:  # (a weight load queued on the workers, weight_sync.overlap, does not hold the step)
            self.engines.prioritize(self.buffer.awaited(count, version))  # the engines run these first
            self._poll(POLL_S)
            self.launch(step)
            batch = self.buffer.take(count, version, wait_for_due=time.perf_counter() - t0 < DUE_WAIT_S)
        self.engines.prioritize([])
        samples, self.taken, self.engines.failed = batch.samples, True, False
        if self.group_scores is not None:
            self.taken_scores = self.group_scores.pop([g.group_id for g in batch.groups])
        self._forget_dropped()  # the batch's groups and any dropped on the way
        if self.env_cfg:  # multi-turn: env/* and the failure policy of the batch (may stop the run)
            self._env_row(batch, step, row)
        self.launch(step)  # after the first batch: the k batches ahead start now, while this step trains
        row.update(self.buffer.metrics(batch))
        row.update(self._row_metrics(samples, time.perf_counter() - t0))
        return [s.to_trajectory() for s in samples]

    def more(self, step: int, round_: int, version: int, row: dict, groups: int) -> list[Trajectory]:
        """`groups` more complete groups for step `step` (dynamic sampling's round `round_`), taken as `take` does. A
        step trains rollout.prompts_per_step of the groups it takes, so these free their slots for new groups first."""
        self.buffer.release(groups)
        self.launch(step)
        return self.take(step, version, row, groups)

    def scores(self, row: dict) -> Optional[BatchScores]:
        """The rewards and reference logprobs of the batch taken last, scored per group as each completed, waited
        for here (`stream/score_wait_s` into `row`); None when nothing is scored per group. Raises what the wait
        raises (see `GroupScores.collect`)."""
        taken, self.taken_scores = self.taken_scores, None
        return None if taken is None else self.group_scores.collect(taken, row)

    def pump(self) -> None:
        """While the trainer trains (`Job.wait`'s pump): drain every worker once without waiting, scoring the groups
        completed. A failed worker call is left to the polls after the train step (`take` or the sync replace it)."""
        if not self.engines.failed:
            self._poll(0.0, recover=False)
        elif self.on_poll is not None:
            self.on_poll()

    def _env_row(self, batch, step: int, row: dict) -> None:
        """env/* of a multi-turn batch into `row`, then env.max_failed_frac (see the module docstring).
        Raises TooManyFailuresError past it, RuntimeError when no episode of the batch started."""
        tally = batch_env_tally(batch.groups)
        row.update(tally.metrics())
        if self.actor_restarts is not None:
            row["env/actor_restarts"], self.actor_restarts = self.actor_restarts, 0.0
        name = self.env_cfg["name"]
        check_env_failures(env_failures([([], row)], name, tally.episodes), self.env_cfg, step, tally.first_error, row)
        if not batch.samples:
            raise no_trajectory_error(name)

    def finish_in_flight(self, row: dict) -> None:
        """Nothing waits here: the weight sync pauses the engines' requests and continues them after the load."""
        n = max(len(self.engines), 1)
        row.update({f"rollout/worker_{name}_s_mean": self.engine_s[k] / n for k, name in ENGINE_KEYS.items()})
        self.engine_s = dict.fromkeys(ENGINE_KEYS, 0.0)

    def synced(self, version: int) -> None:
        self.version = version

    def loader_state(self) -> Optional[dict]:
        return None  # the loader's own state: `state_dict` carries the groups drawn and not trained

    def state_dict(self) -> Optional[dict]:
        """{"mode": "stream" (orchestrator/rollout/resume_mode.py), "requests": every group started and not trained
        (JSON), "dropped_groups", "dropped_samples", "batches_drawn", "multi_turn", "env" (env.name), "max_staleness"
        (k)} and, single-turn, orchestrator/rollout/stream_state.py's keys (the workers' snapshots)."""
        in_flight = None if self.env_cfg else self._snapshot()  # multi-turn: regenerated on resume
        state = {"mode": STREAM, "requests": [dataclasses.asdict(r) for _, r in sorted(self.requests.items())],
                 "dropped_groups": self.buffer.dropped_groups, "dropped_samples": self.buffer.dropped_samples,
                 "batches_drawn": self.batches_drawn, "multi_turn": bool(self.env_cfg),
                 "env": self.env_cfg["name"] if self.env_cfg else None, "max_staleness": self.buffer.k}
        if in_flight is not None:
            state.update(generation_state(self.buffer, in_flight))
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume: the checkpoint's finished samples into the buffer and its in-flight samples continued on the
        workers (single-turn); without them (multi-turn, older checkpoints) the untrained groups are submitted
        again (regenerated on the current weights). Raises ValueError for an inconsistent state (`restore_plan`),
        ResumeModeError for a state another mode wrote (GRPOController.restore drops a one-step-off one)."""
        from orchestrator.rollout.pending import prompt_request_from_dict

        check_written_by(state, STREAM, "StreamRollouts.load_state_dict")

        self.buffer.dropped_groups = int(state.get("dropped_groups", 0))
        self.buffer.dropped_samples = int(state.get("dropped_samples", 0))
        self.batches_drawn = int(state.get("batches_drawn", self.batches_drawn))
        requests = [prompt_request_from_dict(r) for r in state.get("requests", [])]
        if self.env_cfg or not all(k in state for k in STATE_KEYS):
            if requests:
                self.submit(requests)
            return
        plan = restore_plan(state, {r.group_id: r for r in requests}, self.n, self.max_tokens)
        sends: dict[int, list] = {}
        for request, finished, to_run in plan:
            gid = request.group_id
            self.buffer.submit(gid, self.engines.size(request))
            self.requests[gid] = request
            for sample in finished:
                self.buffer.add(sample)  # a complete group joins `ready` here, in the checkpoint's order
            if to_run:
                sends.setdefault(self.engines.place(gid, len(to_run)), []).extend(to_run)
        for w, samples in sends.items():
            self.engines.send(w, "stream_resume", samples)

    def _snapshot(self) -> list[PartialSample]:
        """Every worker's snapshot (actors/rollout/stream.py): its finished samples into the buffer, as a drain;
        returns copies of the unfinished ones of groups in flight. A lost worker's groups start again on its
        replacement (StreamWorkers.lost); the checkpoint holds none of their samples then (a resume generates them again)."""
        in_flight: list[PartialSample] = []
        for i, (finished, running) in self.engines.each("stream_snapshot"):
            self._received(i, finished)
            in_flight += [s for s in running if s.request.group_id in self.buffer.pending]
        return in_flight

    def discard(self, engine_version: Optional[int] = None) -> list[int]:
        """Forget every untrained group (the engines are being replaced; a restore brings back the checkpoint's
        groups through `load_state_dict`). Returns their ids."""
        ids = sorted(self.requests)
        self.buffer = GroupBuffer(self.buffer.k, self.per_step)
        self.buffer.started = self.version * self.per_step
        self.requests = {}
        self.engines.reset()
        if self.group_scores is not None:
            self.group_scores.retain(())
        self.taken_scores = None
        self.version = self.version if engine_version is None else engine_version
        return ids

    def _poll(self, wait_s: float, recover: bool = True) -> None:
        """Drain every worker once (the first waits up to `wait_s` seconds for a finished sample), then issue the
        scoring of the groups completed (`recover`: see StreamWorkers.each). `on_poll` first."""
        if self.on_poll is not None:
            self.on_poll()
        for i, (samples, metrics) in self.engines.each("stream_drain", recover, lambda i: (wait_s if i == 0 else 0.0,)):
            self.engine_s = {k: v + metrics.get(k, 0.0) for k, v in self.engine_s.items()}
            if "env/actor_restarts" in metrics:
                self.actor_restarts = (self.actor_restarts or 0.0) + metrics["env/actor_restarts"]
            self.stream = {k: v for k, v in metrics.items() if k.startswith("stream/")} or self.stream
            self._received(i, samples)
        self._score_ready()

    def _score_ready(self) -> None:
        """Issue the scoring of every complete group not scored yet (drained, or put back by a checkpoint or a resume)."""
        if self.group_scores is not None:
            for g in self.buffer.ready:
                if g.group_id not in self.group_scores:
                    self.group_scores.issue(g.group_id, [s.to_trajectory() for s in g.trained])

    def _received(self, w: int, samples: list) -> None:
        """Finished samples drained from worker w: into the buffer (those of groups still in flight)."""
        self.engines.drained(w, len(samples))
        for s in samples:
            self._add(s)

    def _add(self, sample: PartialSample) -> None:
        if sample.request.group_id in self.buffer.pending:
            self.buffer.add(sample)

    def _forget_dropped(self) -> None:
        """Dropped groups leave `requests` (they are not retried: a fresh batch takes their place)."""
        live = set(self.buffer.pending) | {g.group_id for g in self.buffer.ready}
        for gid in [g for g in self.requests if g not in live]:
            self.requests.pop(gid)
        if self.group_scores is not None:
            self.group_scores.retain(live)
        self.engines.keep(self.buffer.pending)

    def _row_metrics(self, samples: list, wait_s: float) -> dict[str, float]:
        """rollout/* of the batch (PartialSamples, or multi-turn EpisodeSamples: `episode_metrics`, orchestrator/rollout/partial_episode.py; rollout/tokens
        counts their observation ids too) and the workers' stream/*."""
        tokens, (restarts, reissued) = sum(len(s.response_ids) for s in samples), self.engines.take_counts()
        stale = max(self.version - s.first_version for s in samples)
        return {"rollout/tokens": float(tokens), "rollout/staleness": float(stale),
                "rollout/response_len_mean": tokens / len(samples), "async/trainer_wait_s": wait_s,
                "rollout/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
                "rollout/worker_restarts": float(restarts), "rollout/groups_reissued": float(reissued),
                **episode_metrics(samples), **{k: v for k, v in self.stream.items() if k not in ENGINE_KEYS}}

