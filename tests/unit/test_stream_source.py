"""The controller side of fully asynchronous rollouts (orchestrator/rollout/stream_source.py) over fake workers:
the capacity rule draws whole batches, groups go to the least-loaded worker, batches come in completion order
within the staleness bound, dropped groups are refilled, and a checkpoint's untrained groups come back on resume.

    .venv/bin/python -m pytest tests/unit/test_stream_source.py -q
"""
from __future__ import annotations

from types import SimpleNamespace

from orchestrator.rollout.partial import samples_of, snapshot_copy
from orchestrator.rollout.stream_source import StreamRollouts, async_rollouts
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
        return out, {"stream/busy_s": 0.1, "stream/running": 0.0}


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
        self.stream_submit = self.stream_drain = _Call(lambda *a: _Lost("actor died"))


def _wait(ref):
    if isinstance(ref, Exception):
        raise ref
    return ref


def _setup(k=1, workers=2, start_step=0, recover=None):
    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=2, n=2, max_new_tokens=4, partial_rollout=True),
                          algo=SimpleNamespace(max_staleness=k))
    engine, loader = SimpleNamespace(version=0), _Loader()
    fakes = [_FakeWorker(engine) for _ in range(workers)]

    def sample(step):
        loader.drawn += 1
        return [PromptRequest(group_id=step * 2 + i, prompt_ids=[1, 2], answer="") for i in range(2)]

    rollouts = StreamRollouts(fakes, _wait, sample, loader, cfg, start_step, recover)
    return rollouts, fakes, engine, loader, cfg


def test_capacity_draws_k_plus_one_batches_and_spreads_groups_over_workers():
    rollouts, fakes, _, loader, _ = _setup(k=2)
    rollouts.launch(1)
    assert loader.drawn == 3 and sorted(rollouts.requests) == [2, 3, 4, 5, 6, 7]
    assert sorted(len(f.samples) for f in fakes) == [6, 6]  # 12 samples, least-loaded first


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
    resumed, fakes, _, resumed_loader, _ = _setup(k=1, start_step=3)
    resumed.load_state_dict(state)
    assert sorted(resumed.requests) == sorted(untrained) and resumed.batches_drawn == state["batches_drawn"]
    assert sum(len(f.samples) for f in fakes) == 2 * len(untrained)
    resumed.launch(4)  # the capacity counts the 3 trained batches: (3 + 1 + 1) batches in all, no more
    assert resumed.buffer.started == 5 * 2 and resumed_loader.drawn == 5 - 3 - len(untrained) // 2
    assert rollouts.discard() == sorted(untrained) and rollouts.requests == {}


def test_a_group_over_the_bound_is_dropped_and_its_slot_refilled():
    rollouts, fakes, engine, loader, _ = _setup(k=1, workers=1)
    rollouts.launch(1)  # batches 1 and 2 at version 0
    row = {}
    rollouts.take(1, 0, row)
    engine.version = 5  # the engines jumped ahead (e.g. many syncs): batch 2's samples were stamped at 0
    row = {}
    trajs = rollouts.take(4, 3, row)  # policy version 3: batch 2 (version 0) is 3 > 1 behind: dropped
    assert row["async/dropped_groups"] == 2.0 and len(trajs) == 4
    assert all(t.weight_version == 5 for t in trajs) and loader.drawn >= 3


def test_the_factory_picks_the_stream_with_partial_rollout():
    rollouts, fakes, _, loader, cfg = _setup()
    source = SimpleNamespace(workers=fakes, wait=lambda refs: refs, recover=None)
    assert isinstance(async_rollouts(source, lambda s: [], loader, cfg), StreamRollouts)


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
    held = [g for g, w in rollouts.where.items() if w == 0]
    assert held  # worker 0 holds groups in flight when it dies
    fakes[0].samples = []  # its samples die with it
    rollouts.workers[0] = _DeadWorker()
    rollouts.sent_to[0] = rollouts.workers[0]  # the dead handle is the one its groups went to
    row = _run_steps(rollouts, engine, [2], trained)
    assert replaced == [0] and row["rollout/worker_restarts"] == 1.0 and row["rollout/groups_reissued"] == len(held)
    _run_steps(rollouts, engine, [3, 4], trained)
    assert len(trained) == 4 * 4 and len(set(trained)) == 8  # 4 steps x 2 groups x 2 samples
    assert all(trained.count(g) == 2 for g in trained)  # each group trained once, whole


def test_a_worker_replaced_by_the_weight_sync_gets_its_groups_again():
    rollouts, fakes, engine, _, _ = _setup(k=1)
    rollouts.launch(1)
    held = sorted(g for g, w in rollouts.where.items() if w == 1)
    fakes[1].samples = []  # replaced (e.g. its weight load hung): its requests are gone
    rollouts.workers[1] = fresh = _FakeWorker(engine)
    row = {}
    trajs = rollouts.take(1, 0, row)
    assert len(trajs) == 4 and rollouts.sent_to[1] is fresh
    assert row["rollout/groups_reissued"] == len(held) and row["rollout/worker_restarts"] == 0.0


def test_a_lost_worker_without_a_recover_hook_raises():
    import pytest

    for recover in (None, lambda w, e: None):  # no hook, or the hook says the error is not a lost worker
        rollouts, _, _, _, _ = _setup(k=1, recover=recover)
        rollouts.launch(1)
        rollouts.workers[0] = rollouts.sent_to[0] = _DeadWorker()
        with pytest.raises(_Lost):
            rollouts.take(1, 0, {})
