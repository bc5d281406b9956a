"""The controller side of fully asynchronous rollouts (orchestrator/rollout/stream_source.py) over fake workers:
the capacity rule draws whole batches, groups go to the least-loaded worker, batches come in completion order
within the staleness bound, dropped groups are refilled, and a checkpoint's untrained groups come back on resume.

    .venv/bin/python -m pytest tests/unit/test_stream_source.py -q
"""
from __future__ import annotations

from types import SimpleNamespace

from orchestrator.rollout.partial import samples_of
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


def _setup(k=1, workers=2, start_step=0):
    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=2, n=2, partial_rollout=True),
                          algo=SimpleNamespace(max_staleness=k))
    engine, loader = SimpleNamespace(version=0), _Loader()
    fakes = [_FakeWorker(engine) for _ in range(workers)]

    def sample(step):
        loader.drawn += 1
        return [PromptRequest(group_id=step * 2 + i, prompt_ids=[1, 2], answer="") for i in range(2)]

    rollouts = StreamRollouts(fakes, lambda refs: refs, sample, loader, cfg, start_step)
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
    state = rollouts.state_dict()
    untrained = [r["group_id"] for r in state["requests"]]
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
    source = SimpleNamespace(workers=fakes, wait=lambda refs: refs)
    assert isinstance(async_rollouts(source, lambda s: [], loader, cfg), StreamRollouts)
