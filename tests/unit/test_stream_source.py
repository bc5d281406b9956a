"""The controller side of fully asynchronous rollouts (orchestrator/rollout/stream_source.py) over fake workers:
the capacity rule draws whole batches, groups go to the least-loaded worker, batches come in completion order
within the staleness bound, dropped groups are refilled, a checkpoint's untrained groups come back on resume, and
multi-turn batches get their groups' env/* keys and the env.max_failed_frac rule (failed starts complete their group).

    .venv/bin/python -m pytest tests/unit/test_stream_source.py -q
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from orchestrator.envs.env_runner import EnvFailure
from orchestrator.rollout.multiturn import TrajectoryBuilder
from orchestrator.rollout.partial import samples_of, snapshot_copy
from orchestrator.rollout.partial_episode import EpisodeSample, FailedEpisode, GroupEnvTally
from orchestrator.rollout.pipeline import rollout_pipeline
from orchestrator.rollout.stream_source import StreamRollouts
from orchestrator.rollout.types import PromptRequest


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _FakeWorker:
    """Finishes every submitted sample on the next drain, stamped with `engine.version` (one token each)."""

    def __init__(self, engine):
        self.engine, self.samples = engine, []
        self.stream_submit = _Call(self._submit)
        self.stream_drain = _Call(self._drain)
        self.stream_snapshot = _Call(lambda: ([], [snapshot_copy(s) for s in self.samples]))
        self.stream_resume = _Call(self._resume)
        self.prioritized = []  # the group ids of each stream_prioritize call
        self.stream_prioritize = _Call(self.prioritized.append)

    def _resume(self, samples):
        self.samples += samples
        return len(samples)

    def _submit(self, requests):
        self.samples += [s for r in requests for s in samples_of(r, 2, 4)]
        return len(self.samples)

    def _drain(self, wait_s):
        out, self.samples = self.samples, []
        for s in out:
            s.extend([1], [-0.5], self.engine.version)
            s.finish("stop")
        return out, {"stream/busy_s": 0.1, "stream/held_s": 0.05, "stream/running": 0.0}


class _Loader:
    def __init__(self):
        self.drawn = 0

    def state_dict(self):
        return {"drawn": self.drawn}


class _Lost(Exception):
    """What the job's wait raises for a call on a dead worker (ray's ActorDiedError)."""


class _DeadWorker:
    """A worker whose process died: every call's result raises _Lost when waited for."""

    def __init__(self):
        self.stream_submit = self.stream_drain = self.stream_prioritize = _Call(lambda *a: _Lost("actor died"))


def _wait(ref):
    if isinstance(ref, Exception):
        raise ref
    return ref


def _setup(k=1, workers=2, start_step=0, recover=None, score_group=None):
    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=2, n=2, max_new_tokens=4, mode="stream"),
                          algo=SimpleNamespace(max_staleness=k))
    engine, loader = SimpleNamespace(version=0), _Loader()
    fakes = [_FakeWorker(engine) for _ in range(workers)]

    def sample(step):
        loader.drawn += 1
        return [PromptRequest(group_id=step * 2 + i, prompt_ids=[1, 2], answer="") for i in range(2)]

    rollouts = StreamRollouts(fakes, _wait, sample, loader, cfg, start_step, recover, score_group=score_group)
    return rollouts, fakes, engine, loader, cfg


def test_the_first_batch_runs_alone_then_capacity_draws_k_plus_one_batches_over_workers():
    rollouts, fakes, _, loader, _ = _setup(k=2)
    rollouts.launch(1)  # the first batch alone: the first step does not wait for k + 1 batches together
    assert loader.drawn == 1 and sorted(rollouts.requests) == [2, 3]
    assert sorted(len(f.samples) for f in fakes) == [2, 2]
    submitted = []
    for f in fakes:  # what each worker was given when take() returns (before the step trains)
        f.stream_submit = _recording(f.stream_submit, submitted)
    trajs = rollouts.take(1, 0, {})
    assert sorted({t.group_id for t in trajs}) == [2, 3]
    assert loader.drawn == 3 and sorted(rollouts.requests) == [4, 5, 6, 7] and len(submitted) == 4
    rollouts.launch(2)  # version 0 still: (0 + 2 + 1) batches started, no more
    assert loader.drawn == 3
    assert rollouts.discard() == [4, 5, 6, 7]
    assert _setup(k=2, start_step=3)[0].taken  # a resume continues as the uninterrupted run: no batch alone


def _recording(submit: _Call, into: list) -> _Call:
    """`submit`, recording the group ids it is given in `into`."""
    def call(requests, *args):
        into.extend(r.group_id for r in requests)
        return submit.remote(requests, *args)
    return _Call(call)


def test_while_the_trainer_waits_each_worker_runs_the_groups_it_needs_first_then_none():
    """A take that waits tells each worker which of its groups the batch still needs (stream_prioritize, only when
    that changes), and "none" once the batch is taken; a take that does not wait tells nothing."""
    rollouts, fakes, *_ = _setup(k=1)
    rollouts.launch(1)
    rollouts.take(1, 0, {})  # groups 2 and 3, one on each worker, finish at the first drain
    assert sorted(f.prioritized[0][0] for f in fakes) == [2, 3] and all(f.prioritized[1:] == [[]] for f in fakes)
    rollouts.pump()  # the next batch (groups 4, 5) finishes while the trainer trains
    rollouts.take(2, 1, {})
    assert all(len(f.prioritized) == 2 for f in fakes)


def test_batches_in_order_within_the_bound_and_resume_brings_back_untrained_groups():
    rollouts, _, engine, loader, cfg = _setup(k=1)
    for step in (1, 2, 3):
        rollouts.launch(step)
        row = {}
        trajs = rollouts.take(step, step - 1, row)
        assert len(trajs) == 4 and row["async/staleness_max"] <= 1 and row["rollout/tokens"] == 4.0
        engine.version = step  # the sync
        rollouts.finish_in_flight(row)
        rollouts.synced(step)
    state = {k: v for k, v in rollouts.state_dict().items() if k not in ("ready", "finished", "in_flight")}
    untrained = [r["group_id"] for r in state["requests"]]  # a checkpoint of requests only (older): regenerated
    assert untrained and state["batches_drawn"] == loader.drawn
    resumed, fakes, resumed_engine, resumed_loader, _ = _setup(k=1, start_step=3)
    resumed_engine.version = 3  # the checkpoint's weights
    resumed.load_state_dict(state)
    assert sorted(resumed.requests) == sorted(untrained) and resumed.batches_drawn == state["batches_drawn"]
    assert sum(len(f.samples) for f in fakes) == 2 * len(untrained)
    resumed.launch(4)  # the capacity counts the 3 trained batches: (3 + 1 + 1) batches in all, no more
    assert resumed.buffer.started == 5 * 2 and resumed_loader.drawn == 5 - 3 - len(untrained) // 2
    assert rollouts.discard() == sorted(untrained) and rollouts.requests == {}


def test_a_due_group_stuck_in_flight_is_waited_for_until_due_wait_s_then_passed_over(monkeypatch):
    """k = 1, one worker. Group 4 (batch 2) has a sample that never finishes (an engine held after a failed
    verification finishes nothing): at version 1 it is due, so the take keeps a slot for it, tells the worker to run
    it first, and after DUE_WAIT_S takes the groups it has (5, due too, then 6) rather than wait for ever."""
    from orchestrator.rollout import stream_source

    monkeypatch.setattr(stream_source, "DUE_WAIT_S", 0.3)
    rollouts, (fake,), engine, _, _ = _setup(k=1, workers=1)
    drain = fake._drain

    def stuck_drain(wait_s):
        held = [s for s in fake.samples if s.key == "4:1"]
        fake.samples = [s for s in fake.samples if s.key != "4:1"]
        out = drain(wait_s)
        fake.samples += held
        return out
    fake.stream_drain = _Call(stuck_drain)
    rollouts.launch(1)
    rollouts.take(1, 0, {})  # batch 1 (groups 2, 3); batch 2 (groups 4, 5) starts
    rollouts.pump()  # version 0: 4:0 and group 5 finish, 4:1 never does
    engine.version = 1
    rollouts.synced(1)
    rollouts.launch(2)  # batch 3 (groups 6, 7)
    t0 = time.perf_counter()
    trajs = rollouts.take(2, 1, {})
    assert time.perf_counter() - t0 >= 0.3 and [t.group_id for t in trajs][::2] == [5, 6]
    assert [4] in fake.prioritized and fake.prioritized[-1] == []


def test_a_group_over_the_bound_is_dropped_and_its_slot_refilled():
    rollouts, fakes, engine, loader, _ = _setup(k=1, workers=1)
    rollouts.taken = True  # as after a first batch: batches 1 and 2 start together, at version 0
    rollouts.launch(1)
    row = {}
    rollouts.take(1, 0, row)
    engine.version = 5  # the engines jumped ahead (e.g. many syncs): batch 2's samples were stamped at 0
    row = {}
    trajs = rollouts.take(4, 3, row)  # policy version 3: batch 2 (version 0) is 3 > 1 behind: dropped
    assert row["async/dropped_groups"] == 2.0 and len(trajs) == 4
    assert all(t.weight_version == 5 for t in trajs) and loader.drawn >= 3


def test_the_factory_picks_the_stream_for_rollout_mode_stream():
    rollouts, fakes, _, loader, cfg = _setup()
    source = SimpleNamespace(workers=fakes, wait=lambda refs: refs, recover=None)
    assert isinstance(rollout_pipeline(source, lambda s: [], loader, cfg), StreamRollouts)


def _run_steps(rollouts, engine, steps, trained):
    for step in steps:
        rollouts.launch(step)
        row = {}
        trajs = rollouts.take(step, step - 1, row)
        trained += [t.group_id for t in trajs]
        engine.version = step
        rollouts.finish_in_flight(row)
        rollouts.synced(step)
    return row


def test_a_lost_worker_is_replaced_and_its_groups_generated_again_once():
    replaced = []

    def recover(w, error):
        assert isinstance(error, _Lost)
        replaced.append(w)
        return _FakeWorker(engine)

    rollouts, fakes, engine, _, _ = _setup(k=1, recover=recover)
    trained: list = []
    _run_steps(rollouts, engine, [1], trained)
    rollouts.launch(2)
    held = [g for g, w in rollouts.engines.where.items() if w == 0]
    assert held  # worker 0 holds groups in flight when it dies
    fakes[0].samples = []  # its samples die with it
    rollouts.engines.handles[0] = _DeadWorker()
    rollouts.engines.sent_to[0] = rollouts.engines.handles[0]  # the dead handle is the one its groups went to
    row = _run_steps(rollouts, engine, [2], trained)
    assert replaced == [0] and row["rollout/worker_restarts"] == 1.0 and row["rollout/groups_reissued"] == len(held)
    _run_steps(rollouts, engine, [3, 4], trained)
    assert len(trained) == 4 * 4 and len(set(trained)) == 8  # 4 steps x 2 groups x 2 samples
    assert all(trained.count(g) == 2 for g in trained)  # each group trained once, whole


def test_a_worker_replaced_by_the_weight_sync_gets_its_groups_again():
    rollouts, fakes, engine, _, _ = _setup(k=1)
    rollouts.launch(1)
    held = sorted(g for g, w in rollouts.engines.where.items() if w == 1)
    fakes[1].samples = []  # replaced (e.g. its weight load hung): its requests are gone
    rollouts.engines.handles[1] = fresh = _FakeWorker(engine)
    row = {}
    trajs = rollouts.take(1, 0, row)
    assert len(trajs) == 4 and rollouts.engines.sent_to[1] is fresh
    assert row["rollout/groups_reissued"] == len(held) and row["rollout/worker_restarts"] == 0.0


def test_a_lost_worker_without_a_recover_hook_raises():
    for recover in (None, lambda w, e: None):  # no hook, or the hook says the error is not a lost worker
        rollouts, _, _, _, _ = _setup(k=1, recover=recover)
        rollouts.launch(1)
        rollouts.engines.handles[0] = rollouts.engines.sent_to[0] = _DeadWorker()
        with pytest.raises(_Lost):
            rollouts.take(1, 0, {})


# ---- multi-turn groups (env.name): env/* per batch and env.max_failed_frac ----------------------------------------
ENV = {"name": "fake_env", "step_timeout_s": 5.0, "max_failed_frac": 0.5}


class _EpisodeWorker:
    """Finishes every submitted group on the next drain as its `plan` says, one outcome per episode: "ok" (2 turns,
    2 env steps of 0.1 s), "error" / "timeout" (ended by a failed second step) or "reset" (a FailedEpisode)."""

    def __init__(self, engine, plan: dict):
        self.engine, self.plan, self.groups, self.restarts = engine, plan, [], 0.0
        self.stream_submit = _Call(lambda requests, env_cfg, w: self.groups.extend(requests))
        self.stream_drain = _Call(self._drain)

    def _drain(self, wait_s):
        out = [s for r in self.groups for s in self._group(r)]
        self.groups = []
        return out, {"stream/busy_s": 0.1, "stream/running": 0.0, "env/actor_restarts": self.restarts}

    def _group(self, request):
        outcomes = self.plan.get(request.group_id, ["ok", "ok"])
        tally = GroupEnvTally(episodes=len(outcomes))
        out = []
        for i, outcome in enumerate(outcomes):
            if outcome == "reset":
                tally.reset_failures += 1
                tally.failed(EnvFailure("error", "reset", "boom"))
                out.append(FailedEpisode(request, i, "make/reset failed", tally))
                continue
            b = TrajectoryBuilder(request.group_id, [1, 2], sample_index=i)
            b.add_sampled([5, 6], [-0.1, -0.2], [self.engine.version] * 2)
            tally.steps, tally.step_s = tally.steps + 1, tally.step_s + 0.1
            b.add_observation([9])
            b.add_sampled([7], [-0.3], [self.engine.version])
            if outcome == "ok":
                tally.steps, tally.step_s = tally.steps + 1, tally.step_s + 0.1
            else:
                tally.failed(EnvFailure(outcome, "step", "bad step"))
            ep = b.finish("done" if outcome == "ok" else "env_error")
            out.append(EpisodeSample(request, ep, "t", 0, tally))
        return out


def _multi_turn(plan: dict, max_failed_frac: float = 0.5):
    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=2, n=2, max_new_tokens=4, mode="stream"),
                          algo=SimpleNamespace(max_staleness=1))
    engine = SimpleNamespace(version=0)
    worker = _EpisodeWorker(engine, plan)

    def sample(step):
        return [PromptRequest(group_id=step * 2 + i, prompt_ids=[1, 2], answer="") for i in range(2)]

    env = {**ENV, "max_failed_frac": max_failed_frac}
    return StreamRollouts([worker], _wait, sample, _Loader(), cfg, env_cfg=env), worker


def test_a_multi_turn_batch_logs_env_metrics_of_its_groups_and_trains_the_episodes_that_started():
    rollouts, worker = _multi_turn({2: ["reset", "ok"], 3: ["ok", "error"]})  # 2 of 4 episodes failed: 0.5
    worker.restarts = 1.0  # each drain: one env actor replaced since the previous drain
    rollouts.launch(1)
    row = {}
    trajs = rollouts.take(1, 0, row)
    assert [(t.group_id, t.multiturn.sample_index) for t in trajs] == [(2, 1), (3, 0), (3, 1)]
    assert row["env/episodes"] == 4 and row["env/reset_failures"] == 1 and row["env/errors"] == 2
    assert row["env/timeouts"] == 0 and row["env/failed_frac"] == 0.5 and row["env/step_s"] == pytest.approx(0.1)
    assert row["rollout/trajectories"] == 3 and row["rollout/truncated_frac"] == 0.0  # an env error is no truncation
    assert row["env/actor_restarts"] == 1.0 and row["stream/running"] == 0.0  # one drain so far
    assert sum(row[f"async/staleness_{s}"] for s in (0, 1)) == 3  # the failed episode is not trained
    row = {}
    assert len(rollouts.take(2, 1, row)) == 4  # groups 4 and 5, whole (drained with groups 2 and 3 by the first take)
    assert row["env/actor_restarts"] == 1.0 and row["env/failed_frac"] == 0.0  # counted since the last batch only


def test_more_failed_episodes_than_env_max_failed_frac_stop_the_run_naming_the_env():
    from orchestrator.reward.failures import TooManyFailuresError

    rollouts, _ = _multi_turn({2: ["reset", "ok"], 3: ["timeout", "ok"]}, max_failed_frac=0.25)
    rollouts.launch(1)
    with pytest.raises(TooManyFailuresError, match=r"2 of 4 environment episodes failed .*env.max_failed_frac=0.25"
                                                   r".*'fake_env': 1 timeout, 1 error.*first error: env reset error: boom"):
        rollouts.take(1, 0, {})


def test_a_group_whose_every_reset_failed_completes_and_a_batch_without_trajectories_raises():
    rollouts, _ = _multi_turn({2: ["reset", "reset"]}, max_failed_frac=1.0)
    rollouts.launch(1)
    row = {}
    trajs = rollouts.take(1, 0, row)  # group 2 completes (no hang) and trains nothing; group 3 trains whole
    assert [t.group_id for t in trajs] == [3, 3] and row["env/reset_failures"] == 2 and row["env/failed_frac"] == 0.5
    rollouts, _ = _multi_turn({2: ["reset", "reset"], 3: ["reset", "reset"]}, max_failed_frac=1.0)
    rollouts.launch(1)
    with pytest.raises(RuntimeError, match="no trajectory: every reset of env.name='fake_env' failed"):
        rollouts.take(1, 0, {})


def test_more_groups_for_a_step_free_their_slots_so_the_stream_keeps_its_capacity():
    rollouts, fakes, engine, loader, cfg = _setup(k=1)
    rollouts.launch(1)
    first = rollouts.take(1, 0, {})  # batch 1 (groups 2, 3); batch 2 (groups 4, 5) starts: capacity (0 + 2) * 2
    assert sorted({t.group_id for t in first}) == [2, 3] and loader.drawn == 2
    extra = rollouts.more(1, 1, 0, {}, groups=1)  # one group more: its slot is freed first (the step trains 2)
    assert len({t.group_id for t in extra}) == 1 and len(extra) == 2
    assert rollouts.buffer.started == 3 and loader.drawn == 2  # one slot free: batches start whole
    rollouts.more(1, 2, 0, {}, groups=1)  # a second slot freed: batch 3 starts
    assert rollouts.buffer.started == 2 + 2 and loader.drawn == 3  # trained 2, batch 3 live
    with pytest.raises(ValueError, match="only"):
        rollouts.buffer.release(99)


def test_engines_join_and_leave_a_stream_between_steps_and_the_leaving_ones_groups_start_again_once():
    """placement.elastic in a stream (docs/elastic.md): the job kills a retiring engine and moves its last engine into
    the index (Job._remove_engine); the stream's workers follow (StreamWorkers.fit): the left engine's groups start
    again, whole, on the others (none lost, none trained twice), the moved engine keeps its own, and an engine added
    after that gets new groups."""
    from collections import Counter

    rollouts, fakes, engine, _, _ = _setup(k=2, workers=3)
    rollouts.launch(1)
    rollouts.take(1, 0, {})  # batch 1 trained; batches 2 and 3 (groups 4..7) submitted over the three workers
    leaving, moved = fakes[0], fakes[2]
    held = {s.request.group_id for s in leaving.samples}
    assert held and moved.samples
    fakes[0] = fakes.pop()  # engine 0 retired: killed (its samples never drained), the last takes index 0
    trained, rows = Counter(), []
    for step, version in ((2, 1), (3, 2)):
        engine.version = version
        rollouts.synced(version)
        if step == 3:
            fakes.append(_FakeWorker(engine))  # an engine added after step 2
        row = {}
        trained.update(t.group_id for t in rollouts.take(step, version, row))
        rows.append(row)
    assert rows[0]["rollout/groups_reissued"] == len(held) and rows[0]["rollout/worker_restarts"] == 0
    assert set(trained.values()) == {2} and leaving.samples  # each group's 2 samples once; the left one never drained
    assert len(rollouts.engines.outstanding) == len(rollouts.engines.sent_to) == 3
    assert fakes[2].samples or any(w == 2 for w in rollouts.engines.where.values())  # the new engine got groups


def test_a_lost_engine_that_leaves_the_job_and_a_move_with_an_add_in_one_window_keep_every_group_once():
    """placement.elastic: a lost engine whose group cannot be placed again leaves the job (Job.replace_rollout: the
    last engine takes its index and is returned); an engine that left and one added before the next poll leave the
    count unchanged. Either way the moved engine keeps its own groups (not generated twice: the buffer would refuse a
    duplicate sample) and the lost or left one's start again once."""
    from collections import Counter

    def leave(w, error):  # the job's hook: engine w leaves, the last takes its index
        fakes[w] = fakes.pop()
        return fakes[w if w < len(fakes) else 0]

    rollouts, fakes, engine, _, _ = _setup(k=2, workers=3, recover=leave)
    rollouts.launch(1)
    rollouts.take(1, 0, {})  # groups 4..7 in flight: 4, 7 on worker 0; 5 on 1; 6 on 2
    dead = fakes[0]
    fakes[0] = _DeadWorker()  # worker 0 dies (its groups with it) and its group cannot be placed again
    rollouts.engines.sent_to[0] = fakes[0]
    trained = Counter()
    row = {}
    trained.update(t.group_id for t in rollouts.take(2, 1, row))
    assert len(fakes) == 2 and row["rollout/worker_restarts"] == 1.0 and row["rollout/groups_reissued"] == 2
    assert dead.samples  # never drained
    # a move and an add with no poll between: [B, C] -> C leaves from index 0... here B leaves, C moves, D joins
    fakes[0] = fakes.pop()
    fakes.append(_FakeWorker(engine))
    for step, version in ((3, 2), (4, 3)):
        engine.version = version
        rollouts.synced(version)
        trained.update(t.group_id for t in rollouts.take(step, version, {}))
    assert set(trained.values()) == {2}  # every group trained once, whole


def test_stream_workers_restart_only_the_groups_of_engines_that_left():
    """StreamWorkers directly: which groups start again when the job's engine list changes (a lost engine that left
    with the last moved into its index; a leave and an add in one window, the count unchanged)."""
    from orchestrator.rollout.stream_workers import StreamWorkers

    engine = SimpleNamespace(version=0)
    fakes = [_FakeWorker(engine) for _ in range(3)]
    restarted = []

    def restart(gid):
        restarted.append(gid)
        return PromptRequest(group_id=gid, prompt_ids=[1], answer="")

    def leave(w, error):
        fakes[w] = fakes.pop()
        return fakes[w if w < len(fakes) else 0]

    workers = StreamWorkers(fakes, _wait, leave, restart, None, 2)
    workers.assign([PromptRequest(group_id=g, prompt_ids=[1], answer="") for g in range(6)])  # 0,3 | 1,4 | 2,5
    a, b, c = fakes
    workers.lost(a, _Lost("actor died"))  # A left; C took index 0
    assert sorted(restarted) == [0, 3] and workers.sent_to == [c, b] and workers.restarts == 1
    assert {g: w for g, w in workers.where.items() if g in (1, 2, 4, 5)} == {1: 1, 4: 1, 2: 0, 5: 0}
    restarted.clear()
    on_c = sorted(g for g, w in workers.where.items() if w == 0)  # its own (2, 5) and A's re-placed there
    on_b = sorted(g for g, w in workers.where.items() if w == 1)
    assert {2, 5} <= set(on_c) and {1, 4} <= set(on_b)
    fakes[0] = fakes.pop()  # C leaves from index 0 (B moves there) and D joins: the count stays 2
    d = _FakeWorker(engine)
    fakes.append(d)
    workers.fit()
    assert sorted(restarted) == on_c and workers.sent_to == [b, d]  # C's groups start again, not B's
    assert all(workers.where[g] == 0 for g in on_b)
    workers.lost(c, _Lost("gone"))  # a late failure of a handle that left: not asked about again
    assert workers.restarts == 1
