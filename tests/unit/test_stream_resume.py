"""Exact resume of a single-turn streaming run (orchestrator/rollout/stream_state.py through
orchestrator/rollout/stream_source.py) over fake workers whose tokens and logprobs are a function of the sample and
the position: a checkpoint (JSON round trip) holds every finished and in-flight sample once with its tokens,
versions and logprobs, and the resumed run trains exactly what the uninterrupted run trains; older checkpoints and
inconsistent ones.

    .venv/bin/python -m pytest tests/unit/test_stream_resume.py -q
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.rollout.partial import PartialSample, sample_from_state, sample_state, samples_of, snapshot_copy
from orchestrator.rollout.pending import pack_json
from orchestrator.rollout.stream_source import StreamRollouts
from orchestrator.rollout.stream_state import unpacked
from orchestrator.rollout.types import PromptRequest

N, MAX_TOKENS = 3, 6


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _StepWorker:
    """A streaming engine: each drain runs one step (every sample one token, stamped with `engine.version`); a
    sample of group g, index i finishes after 1 + (g + 2 i) % MAX_TOKENS tokens. `step()` runs one without a drain
    (the finished wait in `done`, as on a worker between two drains)."""

    def __init__(self, engine):
        self.engine, self.samples, self.done = engine, [], []
        self.stream_submit = _Call(lambda rs: self._queue([s for r in rs for s in samples_of(r, N, MAX_TOKENS)]))
        self.stream_resume = _Call(self._queue)
        self.stream_drain = _Call(self._drain)
        self.stream_snapshot = _Call(self._snapshot)
        self.stream_prioritize = _Call(lambda group_ids: None)  # a fake engine: no order to keep

    def _queue(self, samples):
        self.samples += samples
        return len(samples)

    def step(self):
        for s in self.samples:
            g, i, pos = s.request.group_id, s.index, len(s.response_ids)
            s.extend([(g * 31 + i * 7 + pos) % 50], [-0.01 * (pos + 1) - 0.001 * i - 1e-7 * g], self.engine.version)
            if len(s.response_ids) == 1 + (g + 2 * i) % MAX_TOKENS:
                s.finish("stop")
        self.done += [s for s in self.samples if s.done]
        self.samples = [s for s in self.samples if not s.done]

    def _drain(self, wait_s):
        self.step()
        out, self.done = self.done, []
        return out, {"stream/busy_s": 0.1}

    def _snapshot(self):
        out, self.done = self.done, []
        return out, [snapshot_copy(s) for s in self.samples]


def _setup(workers=1, start_step=0, recover=None, max_staleness=2):
    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=2, n=N, max_new_tokens=MAX_TOKENS),
                          algo=SimpleNamespace(max_staleness=max_staleness))
    engine = SimpleNamespace(version=start_step)
    fakes = [_StepWorker(engine) for _ in range(workers)]

    def sample(step):
        return [PromptRequest(group_id=step * 2 + i, prompt_ids=[1, 2], answer=str(i)) for i in range(2)]

    return StreamRollouts(fakes, _wait, sample, None, cfg, start_step, recover), fakes, engine


def _wait(ref):
    if isinstance(ref, Exception):
        raise ref
    return ref


def _steps(rollouts, engine, steps) -> list[tuple]:
    """Train `steps` (sync after each); returns every trained trajectory as (group, ids, logprobs, versions)."""
    trained = []
    for step in steps:
        rollouts.launch(step)
        trajs = rollouts.take(step, step - 1, {})
        trained += [(t.group_id, t.response_ids, t.logprobs, t.token_versions) for t in trajs]
        engine.version = step
        rollouts.synced(step)
    return trained


def _checkpoint(rollouts, fakes) -> dict:
    for f in fakes:
        f.step()  # finished samples wait on the worker, not drained: the snapshot hands them over
    return json.loads(json.dumps(rollouts.state_dict()))  # state.json


def test_the_resumed_run_trains_what_the_uninterrupted_run_trains():
    rollouts, fakes, engine = _setup()
    _steps(rollouts, engine, [1, 2, 3])  # (the first batch runs alone: by step 3 the k ahead are part-generated)
    state = _checkpoint(rollouts, fakes)
    finished, in_flight = unpacked(state, "finished"), unpacked(state, "in_flight")
    assert state["ready"] and finished and any(s["response_ids"] for s in in_flight)
    assert {s["group_id"] for s in finished} - set(state["ready"])  # an incomplete group's finished samples
    resumed, _, resumed_engine = _setup(start_step=3)
    resumed.load_state_dict(state)
    expected = _steps(rollouts, engine, [4, 5, 6, 7])
    assert _steps(resumed, resumed_engine, [4, 5, 6, 7]) == expected
    assert len({g for g, *_ in expected}) == 8 and len(expected) == 8 * N  # each group once, whole


def test_a_round_trip_keeps_every_sample_once_with_its_tokens_versions_and_logprobs():
    rollouts, fakes, engine = _setup(workers=2)
    _steps(rollouts, engine, [1, 2])
    before = {s.key: (s.response_ids, s.logprobs, s.token_versions, s.done)
              for f in fakes for s in f.samples + f.done}
    state = _checkpoint(rollouts, fakes)
    before.update({s.key: (s.response_ids, s.logprobs, s.token_versions, True)
                   for g in rollouts.buffer.ready + list(rollouts.buffer.pending.values()) for s in g.samples.values()})
    resumed, resumed_fakes, _ = _setup(workers=2, start_step=2)
    resumed.load_state_dict(state)
    groups = resumed.buffer.ready + list(resumed.buffer.pending.values())
    after = [(s.key, (s.response_ids, s.logprobs, s.token_versions, s.done)) for g in groups for s in g.samples.values()]
    after += [(s.key, (s.response_ids, s.logprobs, s.token_versions, s.done)) for f in resumed_fakes for s in f.samples]
    assert sorted(k for k, _ in after) == sorted(before) == [f"{g}:{i}" for g in sorted(rollouts.requests) for i in range(N)]
    assert dict(after) == before  # nothing lost, nothing twice, tokens / logprobs / versions bit-exact
    assert [g.group_id for g in resumed.buffer.ready] == state["ready"]  # the trainer takes them in the same order
    assert sum(resumed.engines.outstanding) == sum(len(f.samples) for f in resumed_fakes)


def test_a_worker_lost_during_the_snapshot_has_its_groups_generated_again_on_resume():
    replaced = []
    rollouts, fakes, engine = _setup(workers=2, recover=lambda w, e: replaced.append(w) or _StepWorker(engine))
    _steps(rollouts, engine, [1, 2])
    lost = rollouts.engines.where[min(rollouts.buffer.pending)]  # a worker that holds incomplete groups dies
    held = sorted(g for g, w in rollouts.engines.where.items() if w == lost)
    fakes[lost].stream_snapshot = _Call(lambda: RuntimeError("actor died"))
    state = _checkpoint(rollouts, fakes)
    assert replaced == [lost]
    assert not {s["group_id"] for s in unpacked(state, "finished") + unpacked(state, "in_flight")} & set(held)
    resumed, resumed_fakes, resumed_engine = _setup(workers=2, start_step=2)
    resumed.load_state_dict(state)
    fresh = [s for f in resumed_fakes for s in f.samples if s.request.group_id in held]
    assert sorted(s.key for s in fresh) == [f"{g}:{i}" for g in held for i in range(N)]
    assert all(not s.response_ids for s in fresh)  # generated again from nothing
    trained = [g for g, *_ in _steps(resumed, resumed_engine, [3, 4, 5, 6, 7])]
    assert set(held) <= set(trained)
    assert all(trained.count(g) == N for g in trained)  # each group once, whole


def test_an_older_checkpoint_of_requests_only_regenerates_the_groups():
    rollouts, fakes, engine = _setup()
    _steps(rollouts, engine, [1, 2])
    state = {k: v for k, v in _checkpoint(rollouts, fakes).items() if k not in ("ready", "finished", "in_flight")}
    resumed, resumed_fakes, _ = _setup(start_step=2)
    resumed.load_state_dict(state)
    assert not resumed.buffer.ready and all(not s.response_ids for s in resumed_fakes[0].samples)
    assert len(resumed_fakes[0].samples) == N * len(state["requests"])


def test_an_inconsistent_checkpoint_raises():
    rollouts, fakes, engine = _setup()
    _steps(rollouts, engine, [1, 2, 3])
    state = _checkpoint(rollouts, fakes)
    finished = unpacked(state, "finished")
    pending = [s for s in finished if s["group_id"] not in state["ready"]][0]
    twice = dict(state, in_flight=pack_json(unpacked(state, "in_flight") + [dict(pending, finish_reason="")]))
    with pytest.raises(ValueError, match="twice"):
        _setup(start_step=3)[0].load_state_dict(twice)
    stray = dict(state, finished=pack_json(finished + [dict(pending, group_id=999)]))
    with pytest.raises(ValueError, match="999:"):
        _setup(start_step=3)[0].load_state_dict(stray)
    with pytest.raises(ValueError, match="finished samples cannot be decoded"):
        _setup(start_step=2)[0].load_state_dict(dict(state, finished="not base64 zlib"))


def test_sample_state_round_trip_and_bad_versions():
    s = PartialSample(PromptRequest(group_id=4, prompt_ids=[1], answer=""), index=1, max_tokens=8)
    s.extend([5, 6], [-0.25, -1e-9], 2)
    s.extend([7], [-3.5], 3)
    s.interrupted()
    d = json.loads(json.dumps(sample_state(s)))
    assert d["versions"] == [[2, 2], [3, 1]]
    back = sample_from_state(d, s.request)
    assert back == s and back.seed == s.seed
    with pytest.raises(ValueError, match="3 ids, 3 logprobs and 2 versions"):
        sample_from_state(dict(d, versions=[[2, 2]]), s.request)
