"""The rollout worker's streaming engine loop (actors/rollout/stream.py) over a fake engine whose steps are slow
(a prefill of a batch of prompts on CPU takes seconds): `submit` and `drain` never wait for a step in progress,
a pause gets the engine at the next step boundary and the interrupted samples continue on the new version,
every sample comes back exactly once, a snapshot (a checkpoint) sees every sample exactly once and a resumed one
continues with its tokens, and an engine error reaches the next drain.

    .venv/bin/python -m pytest tests/unit/test_stream_generator.py -q
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from actors.rollout import stream as stream_mod
from orchestrator.rollout.types import PromptRequest

STEP_S = 0.4  # one fake engine step


class _SlowEngine:
    """InterruptibleEngine's interface: each step sleeps STEP_S and gives every running sample one token
    (stamped with the version it was added under); a sample is done after `tokens` tokens."""

    def __init__(self, _vllm_engine, tokens: int = 3, fail_at: int = -1):
        self.active: dict[str, tuple] = {}
        self.interruptions = self.steps = 0
        self.tokens, self.fail_at = tokens, fail_at

    @property
    def running(self) -> int:
        return len(self.active)

    def add(self, samples, version):
        for s in samples:
            self.active[s.key] = (s, version)

    def step(self):
        if self.steps == self.fail_at:
            raise RuntimeError("engine step failed")
        time.sleep(STEP_S)
        self.steps += 1
        finished = []
        for key, (s, v) in list(self.active.items()):
            s.extend([7], [-0.1], v)
            if len(s.response_ids) >= self.tokens:
                s.finish("length")
                finished.append(s)
                del self.active[key]
        return finished

    def samples(self):
        return [s for s, _ in self.active.values()]

    def interrupt(self):
        out = [s for s, _ in self.active.values()]
        for s in out:
            s.interrupted()
        self.interruptions += len(out)
        self.active = {}
        return out

    def text(self, sample):
        return "x" * len(sample.response_ids)


def _stream(monkeypatch, **engine_kw):
    box = {"version": 0}
    engine = SimpleNamespace(interruptible=lambda: _SlowEngine(None, **engine_kw))
    gen = stream_mod.StreamingGenerator(engine, n=2, max_tokens=3, version=lambda: box["version"])
    return gen, box


def _requests(start: int, count: int) -> list[PromptRequest]:
    return [PromptRequest(group_id=start + i, prompt_ids=[1, 2, 3], answer="") for i in range(count)]


def _submit_and_step(gen) -> None:
    """Submit 2 groups (4 samples of 3 tokens) and wait until the engine ran a step."""
    gen.submit(_requests(0, 2))
    deadline = time.monotonic() + 10
    while gen.gen.steps < 1 and time.monotonic() < deadline:
        time.sleep(0.02)


def _drain_all(gen, expected: int, timeout_s: float = 20.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        got += gen.drain(0.2)[0]
    return got


def test_submit_and_drain_do_not_wait_for_an_engine_step(monkeypatch):
    gen, _ = _stream(monkeypatch)
    try:
        gen.submit(_requests(0, 2))
        time.sleep(STEP_S / 4)  # the engine thread is inside its first (slow) step now
        t0 = time.perf_counter()
        gen.submit(_requests(2, 2))
        samples, metrics = gen.drain(0.0)
        took = time.perf_counter() - t0
        assert took < STEP_S / 4, f"submit + drain took {took:.3f} s: they waited for the engine step"
        assert samples == [] and metrics["stream/queued"] == 4.0  # the second groups wait for the next step
        got = _drain_all(gen, 8)
        assert len(got) == 8 and len({s.key for s in got}) == 8  # each sample once
    finally:
        gen.close()


def test_a_pause_interrupts_and_the_samples_continue_on_the_new_version(monkeypatch):
    gen, box = _stream(monkeypatch)
    try:
        _submit_and_step(gen)  # 4 samples of 3 tokens, one step run
        with gen.paused():
            assert gen.gen.running == 0  # the engine holds no request during the pause
            box["version"] = 1
            steps = gen.gen.steps
            time.sleep(STEP_S * 1.5)
            assert gen.gen.steps == steps  # no step ran while paused
        got = _drain_all(gen, 4)
        assert len(got) == 4 and len({s.key for s in got}) == 4
        for s in got:
            assert s.token_versions[0] == 0 and s.token_versions[-1] == 1, s.token_versions
            assert s.token_versions == sorted(s.token_versions) and len(s.response_ids) == 3
        assert gen.drain(0.0)[1]["stream/interruptions"] == 4.0
    finally:
        gen.close()


def test_a_hold_lasts_across_calls_and_the_samples_continue_on_the_version_set_before_the_release(monkeypatch):
    gen, box = _stream(monkeypatch)
    try:
        _submit_and_step(gen)  # 4 samples of 3 tokens, one step run
        assert gen.hold() == 4 and gen.gen.running == 0  # an overlapped weight sync: from before the load ...
        steps = gen.gen.steps
        gen.submit(_requests(2, 1))  # submits, drains and pauses go on while held
        with gen.paused():
            box["version"] = 1  # the load
        time.sleep(STEP_S * 1.5)
        assert gen.gen.steps == steps and gen.drain(0.0)[0] == []  # nothing sampled on unverified weights
        gen.release()  # ... until the controller verified the engine
        got = _drain_all(gen, 6)
        assert len(got) == 6 and len({s.key for s in got}) == 6
        held = [s for s in got if s.token_versions[0] == 0]
        assert len(held) == 4 and all(s.token_versions[-1] == 1 and s.token_versions == sorted(s.token_versions)
                                       for s in held), [s.token_versions for s in held]
        assert all(s.token_versions == [1, 1, 1] for s in got if s not in held)
    finally:
        gen.close()


def test_prioritized_groups_enter_the_engine_before_any_other(monkeypatch):
    """The trainer waits for groups 0 and 1, interrupted by a weight sync: groups 2 and 3, submitted meanwhile, enter
    the engine only once 0 and 1 finished (unprioritized, all four enter at once: the hold test above). A priority
    for groups with nothing queued or running holds nothing back."""
    gen, _ = _stream(monkeypatch)
    adds, add = [], gen.gen.add
    gen.gen.add = lambda samples, v: (adds.append(sorted({s.request.group_id for s in samples})), add(samples, v))
    try:
        _submit_and_step(gen)  # groups 0, 1: 4 samples of 3 tokens, one step run
        gen.hold()
        gen.submit(_requests(2, 2))
        gen.prioritize({0, 1})
        gen.release()
        got = _drain_all(gen, 8)
        assert len({s.key for s in got}) == 8 and adds == [[0, 1], [0, 1], [2, 3]]
        assert {s.request.group_id for s in got[:4]} == {0, 1}
        gen.prioritize({0, 1, 7})
        gen.submit(_requests(4, 1))
        assert len(_drain_all(gen, 2)) == 2 and adds[-1] == [4]
    finally:
        gen.close()


def test_a_pause_is_not_starved_by_back_to_back_steps(monkeypatch):
    gen, _ = _stream(monkeypatch, tokens=1000)
    try:
        gen.submit(_requests(0, 2))
        time.sleep(STEP_S / 2)
        t0 = time.perf_counter()
        with gen.paused():
            waited = time.perf_counter() - t0
        assert waited < 2 * STEP_S, f"the pause waited {waited:.2f} s (more than one step)"
    finally:
        gen.close()


def test_an_engine_error_reaches_the_next_drain(monkeypatch):
    gen, _ = _stream(monkeypatch, fail_at=1)
    try:
        gen.submit(_requests(0, 1))
        deadline = time.monotonic() + 10
        with pytest.raises(RuntimeError, match="rollout stream failed"):
            while time.monotonic() < deadline:
                gen.drain(0.1)
        with pytest.raises(RuntimeError, match="rollout stream failed"):
            gen.submit(_requests(5, 1))
    finally:
        gen.close()
    assert not gen.thread.is_alive()


def test_snapshots_see_every_sample_once_and_resumed_copies_continue(monkeypatch):
    gen, box = _stream(monkeypatch)
    finished, keys, partial = {}, {f"{g}:{i}" for g in range(4) for i in range(2)}, []
    try:
        gen.submit(_requests(0, 2))
        for k in range(8):
            if k == 2:
                gen.submit(_requests(2, 2))  # queued between two snapshots
            time.sleep(STEP_S / 3)
            finished.update((s.key, s) for s in gen.drain(0.0)[0])
            t0 = time.perf_counter()
            done, copies = gen.snapshot()
            assert time.perf_counter() - t0 < 2 * STEP_S  # at most the step in progress, then the engine goes on
            assert not {s.key for s in done} & set(finished)  # handed over once: a drain never returns them again
            finished.update((s.key, s) for s in done)
            seen = list(finished) + [s.key for s in copies]
            assert sorted(seen) == sorted(keys if k >= 2 else {key for key in keys if int(key[0]) < 2}), (k, seen)
            assert all(not s.done for s in copies)
            partial = copies if any(s.response_ids for s in copies) else partial
    finally:
        gen.close()
    copies, held = partial, {s.key: list(s.response_ids) for s in partial}
    assert copies
    resumed, box = _stream(monkeypatch)
    box["version"] = 5
    try:
        resumed.resume(copies)
        got = _drain_all(resumed, len(copies))
    finally:
        resumed.close()
    assert sorted(s.key for s in got) == sorted(held)
    for s in got:  # the tokens of the snapshot kept, the rest sampled by version 5
        assert s.response_ids[:len(held[s.key])] == held[s.key] and len(s.response_ids) == 3
        assert s.token_versions[len(held[s.key]):] == [5] * (3 - len(held[s.key]))


def test_held_seconds_are_reported_per_drain(monkeypatch):
    """`stream/held_s`: the seconds held since the last drain (a hold still on counts up to the drain), 0 when
    nothing held the engine; a second hold while held does not restart the clock."""
    gen, _ = _stream(monkeypatch)
    try:
        assert gen.drain(0.0)[1]["stream/held_s"] == 0.0
        gen.hold()
        time.sleep(0.3)
        gen.hold()  # idempotent
        first = gen.drain(0.0)[1]["stream/held_s"]
        time.sleep(0.2)
        gen.release()
        second = gen.drain(0.0)[1]["stream/held_s"]
        assert 0.3 <= first < 1.5 and 0.2 <= second < 1.5, (first, second)  # upper bounds: a busy 2-core host
        assert gen.drain(0.0)[1]["stream/held_s"] == 0.0
    finally:
        gen.close()


def test_the_engine_threads_time_outside_steps_is_reported_by_kind(monkeypatch):
    """`stream/empty_s` (nothing to run), `stream/blocked_s` (work queued, but held or a caller waiting for the
    engine) and `stream/add_s` (handing requests over): where an engine's idle time goes (benchmarks/RESULTS.md)."""
    gen, _ = _stream(monkeypatch)
    try:
        time.sleep(0.3)
        m = gen.drain(0.0)[1]
        assert 0.25 <= m["stream/empty_s"] < 1.5 and m["stream/blocked_s"] < 0.05, m  # a wait still going counts
        gen.hold()
        gen.submit(_requests(0, 1))  # queued while held: blocked, not empty
        time.sleep(0.3)
        m = gen.drain(0.0)[1]
        assert m["stream/blocked_s"] >= 0.25 and m["stream/empty_s"] < 0.1, m
        gen.release()
        assert len(_drain_all(gen, 2)) == 2
        assert 0.0 <= gen.drain(0.0)[1]["stream/add_s"] < 0.5  # the fake engine's add is immediate
    finally:
        gen.close()


def test_the_thread_that_built_the_engine_runs_every_call_between_two_steps(monkeypatch):
    import threading

    built_on = {}

    def build():
        built_on["thread"] = threading.current_thread()
        return SimpleNamespace(interruptible=lambda: _SlowEngine(None, tokens=30))

    gen = stream_mod.StreamingGenerator(None, n=2, max_tokens=30, version=lambda: 0, build=build)
    try:
        assert built_on["thread"] is gen.thread and gen.engine is not None
        gen.submit(_requests(0, 1))
        while gen.gen.running == 0:
            time.sleep(0.01)
        seen = gen.call(lambda engine: (threading.current_thread(), engine, gen.gen.running))
        assert seen == (gen.thread, gen.engine, 0)  # on the driver, with the requests in flight aborted
        assert gen.gen.interruptions == 2
        with pytest.raises(KeyError, match="boom"):
            gen.call(lambda engine: {}["boom"])  # the call's error reaches its caller; the driver goes on
        samples = []
        deadline = time.monotonic() + 60
        while len(samples) < 2 and time.monotonic() < deadline:
            samples += gen.drain(0.5)[0]
        assert sorted(s.key for s in samples) == ["0:0", "0:1"]  # the interrupted samples continued
    finally:
        gen.close()
    assert gen.call(lambda engine: threading.current_thread()) is threading.current_thread()  # closed: on the caller


def test_an_engine_that_fails_to_build_raises_from_the_constructor():
    def build():
        raise MemoryError("no room for the KV cache")

    with pytest.raises(MemoryError, match="KV cache"):
        stream_mod.StreamingGenerator(None, n=2, max_tokens=3, version=lambda: 0, build=build)
