"""Streamed multi-turn episodes on the streaming engine thread (actors/rollout/stream.py, stream_episodes.py) over a
fake vLLM engine that samples one token per step: the episodes' turns share the engine thread with nothing
blocking it, a pause (the weight sync) interrupts turns in flight and they continue on the new version, every
episode of every group comes back once through `drain` with non-decreasing versions, a failed reset comes back as a
`FailedEpisode` (its group completes) and each group's env calls are counted in the tally its samples share. The real engine: tests/integration/test_partial_rollout_multiturn.py.

    .venv/bin/python -m pytest tests/unit/test_stream_episodes.py -q
"""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from actors.rollout.interruptible import InterruptibleEngine
from actors.rollout.stream import StreamingGenerator
from actors.rollout.stream_episodes import StreamingEpisodes, StreamTurns
from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.rollout.router import StickyRouter
from orchestrator.envs.env import EnvStep
from orchestrator.envs.env_runner import EnvFailure
from orchestrator.rollout.types import PromptRequest

ENV = {"name": "fake", "max_turns": 3, "max_tokens": 200}


class _LLMEngine:
    """add_request / step / abort_request of vLLM's LLMEngine: one token (id 5, logprob -0.5) per request a step."""

    def __init__(self, fail_at: int = -1):
        self.requests: dict[str, list] = {}  # request id -> [tokens left]
        self.steps, self.fail_at = 0, fail_at

    def add_request(self, rid, prompt, params):
        self.requests[rid] = [params.max_tokens]

    def abort_request(self, ids):
        for rid in ids:
            self.requests.pop(rid, None)

    def step(self):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("engine step failed")
        time.sleep(0.002)
        out = []
        for rid, left in list(self.requests.items()):
            left[0] -= 1
            done = left[0] == 0
            completion = SimpleNamespace(token_ids=[5], logprobs=[{5: SimpleNamespace(logprob=-0.5)}],
                                         finish_reason="length" if done else None)
            out.append(SimpleNamespace(request_id=rid, outputs=[completion], finished=done, num_cached_tokens=0))
            if done:
                del self.requests[rid]
        return out


class _Envs:
    """A fake env runner: the first `fail_resets` resets raise, the first `timeout_steps` steps time out."""

    def __init__(self, fail_resets: int = 0, timeout_steps: int = 0):
        self.fail_resets, self.timeout_steps = fail_resets, timeout_steps
        self.stats = SimpleNamespace(errors=0, timeouts=0, step_seconds=[], stuck_threads=0)

    async def make(self):
        return object()

    async def reset(self, env, sample):
        if self.fail_resets:
            self.fail_resets -= 1
            raise EnvFailure("error", "reset", "reset failed")
        return [{"role": "user", "content": "hi"}]

    async def step(self, env, action):
        await asyncio.sleep(0.01)  # a slow environment: the engine keeps stepping the other episodes' turns
        if self.timeout_steps:
            self.timeout_steps -= 1
            raise EnvFailure("timeout", "step", "took longer than env.step_timeout_s=1")
        self.stats.step_seconds.append(0.01)  # as the runners do: the seconds inside env.step
        return EnvStep("more", 1.0, False, {})

    def close(self, env):
        pass


def _stream(n: int = 2, fail_at: int = -1):
    engine = SimpleNamespace(llm=SimpleNamespace(llm_engine=_LLMEngine(fail_at)),
                             tokenizer=SimpleNamespace(decode=lambda ids, **k: "t"),
                             cfg=SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_new_tokens=6,
                                                  ignore_eos=False))
    engine.interruptible = lambda: InterruptibleEngine(engine)
    holder = {"version": 0}
    return StreamingGenerator(engine, n, 6, lambda: holder["version"]), holder


def _renderer():
    session = SimpleNamespace(prompt_ids=[1, 2], action_text=lambda ids: "a", observation_ids=lambda c, i, m: [7, 7])
    return SimpleNamespace(start=lambda messages: session)


def _episodes(envs: _Envs, n: int = 2):
    stream, holder = _stream(n)
    multiturn = SimpleNamespace(configure=lambda cfg: None, runner=envs,
                                tokenizer=SimpleNamespace(decode=lambda ids, **k: "t"), renderer=_renderer())
    return stream, StreamingEpisodes(stream, multiturn, n=n, max_new_tokens=6, worker_id=1), holder


def _drain(stream, count: int) -> list:
    """What the stream returns until `count` samples came back (20 s at most)."""
    out, deadline = [], time.monotonic() + 20
    while len(out) < count and time.monotonic() < deadline:
        out += stream.drain(0.2)[0]
    return out


def test_turns_stream_a_pause_interrupts_them_and_every_episode_returns_once():
    stream, episodes, holder = _episodes(_Envs())
    assert episodes.submit([PromptRequest(g, [], "", prompt="p") for g in range(3)], ENV) == 6
    deadline = time.monotonic() + 20
    while holder["version"] == 0 and time.monotonic() < deadline:  # the weight sync, once it lands inside a turn
        with stream.paused():
            if stream.gen.interruptions:
                holder["version"] = 1
        time.sleep(0.002)  # let the engine thread step between pauses (a busy machine starved it)
    samples = _drain(stream, 6)
    assert sorted(s.key for s in samples) == [f"{g}:{i}" for g in range(3) for i in range(2)]
    assert stream.drain(0.1)[0] == [] and stream.gen.interruptions >= 1
    for s in samples:
        t = s.to_trajectory()
        sampled = [v for v, m in zip(t.token_versions, t.multiturn.loss_mask) if m]
        assert t.multiturn.num_turns == 3 and len(sampled) == 18 and sampled == sorted(sampled)
        assert t.token_versions.count(-1) == 4 and t.multiturn.rollout_worker == 1 and t.text == "t"
    assert any(s.num_versions == 2 for s in samples)  # interrupted turns continued on version 1
    episodes.close()
    stream.close()


def test_a_failed_reset_is_a_failed_episode_and_the_group_still_completes_with_its_tally():
    stream, episodes, _ = _episodes(_Envs(fail_resets=1, timeout_steps=1), n=3)
    episodes.submit([PromptRequest(0, [], "")], ENV)
    items = _drain(stream, 3)
    assert sorted(s.key for s in items) == ["0:0", "0:1", "0:2"] and stream.drain(0.1)[0] == []
    failed = [s for s in items if s.failed]
    played = sorted((s for s in items if not s.failed), key=lambda s: s.episode.num_turns)
    assert len(failed) == 1 and failed[0].first_version is None and "env.name='fake'" in failed[0].error
    assert [s.episode.stop_reason for s in played] == ["env_error", "max_turns"]  # the timed-out step ended one
    assert [s.episode.num_turns for s in played] == [1, 3]
    tally = items[0].env
    assert all(s.env is tally for s in items)  # one tally per group, shared by its samples
    assert (tally.episodes, tally.reset_failures, tally.errors, tally.timeouts, tally.steps) == (3, 1, 2, 1, 3)
    assert tally.step_s == pytest.approx(0.03) and "reset failed" in tally.first_error
    episodes.close()
    stream.close()


def test_metrics_report_the_env_actors_replaced_since_the_last_call():
    envs = _Envs()
    stream, episodes, _ = _episodes(envs)
    assert episodes.metrics() == {}  # thread placement: no env actors
    envs.stats.actor_restarts = 2
    assert episodes.metrics() == {"env/actor_restarts": 2.0}
    envs.stats.actor_restarts = 3
    assert episodes.metrics() == {"env/actor_restarts": 1.0}
    episodes.close()
    stream.close()


def _batch_loop(stream):
    """A batch of episodes (rollout.mode=sync / one_step_off, actors/rollout/multiturn_rollout.py) on the same driver."""
    turns = StreamTurns(stream)
    cfg = AgentLoopConfig(max_turns=3, max_tokens=200, max_new_tokens=6)
    return turns, AgentLoop(turns, _Envs(), _renderer(), StickyRouter([0]), cfg)


def test_a_batch_of_episodes_runs_its_turns_on_the_stream_many_at_once():
    stream, _ = _stream()
    turns, loop = _batch_loop(stream)
    episodes, metrics = loop.run_sync([GroupRequest(g, {}, 2) for g in range(3)])
    assert sorted((ep.group_id, ep.sample_index) for ep in episodes) == [(g, i) for g in range(3) for i in range(2)]
    assert all(ep.num_turns == 3 and sum(ep.loss_mask) == 18 for ep in episodes)
    assert turns.turns == 18 and turns.in_flight == 0 and turns.max_in_flight >= 2  # continuous batching
    assert stream.steps >= 18 and stream.drain()[0] == []  # turns never reach drain: they went to their episodes
    stream.close()


def test_an_engine_failure_fails_the_waiting_turns_instead_of_hanging_them():
    stream, _ = _stream(fail_at=4)
    _, loop = _batch_loop(stream)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="engine step failed"):
        loop.run_sync([GroupRequest(g, {}, 2) for g in range(2)])
    assert time.monotonic() - t0 < 10
    stream.close()


def test_closing_the_stream_fails_a_turn_still_waiting():
    stream, _ = _stream()
    with stream.paused():  # the engine takes no step: the turn waits in the queue
        turns = StreamTurns(stream)

        async def turn():
            task = asyncio.ensure_future(turns.generate([1, 2], 4))
            await asyncio.sleep(0.05)
            return task

        loop = asyncio.new_event_loop()
        task = loop.run_until_complete(turn())
    stream.close()
    with pytest.raises(RuntimeError, match="closed before the turn finished"):
        loop.run_until_complete(task)
    loop.close()


def test_turns_never_share_a_key_with_eval_prompts_on_the_same_engine():
    """Held-out eval prompts have group ids -1, -2, ... and run beside streamed turns (rollout.mode=stream)."""
    stream, _ = _stream()
    turns = StreamTurns(stream)
    evals = [PromptRequest(-(i + 1), [1, 2], "", seed=i) for i in range(40)]

    async def both():
        return await asyncio.gather(*[turns.generate([1, 2], 3) for _ in range(40)],
                                    asyncio.get_running_loop().run_in_executor(None, stream.generate, evals))

    *turn_outs, eval_samples = asyncio.run(both())
    assert len(turn_outs) == 40 and all(len(ids) == 3 for ids, *_ in turn_outs)
    assert sorted(s.request.group_id for s in eval_samples) == sorted(r.group_id for r in evals for _ in range(2))
    stream.close()


def test_a_closed_batch_of_episodes_does_not_take_the_engine_thread_down():
    """A batch of episodes fails (its event loop closes) while some of its turns still generate: they finish with
    nobody waiting, and the engine keeps serving."""
    stream, _ = _stream()
    turns = StreamTurns(stream)

    async def one_then_fail():
        asyncio.ensure_future(turns.generate([1, 2], 6))  # left behind when this loop closes
        await asyncio.sleep(0)
        raise ValueError("an episode failed")

    with pytest.raises(ValueError):
        asyncio.run(one_then_fail())
    time.sleep(0.1)  # the orphaned turn finishes on the engine thread
    assert stream.thread.is_alive() and stream.error is None
    assert len(stream.generate([PromptRequest(0, [1], "", seed=1)])) == 2
    stream.close()
    with pytest.raises(RuntimeError, match="closed"):
        stream.submit([PromptRequest(1, [1], "")])


def test_a_generate_call_whose_text_fails_raises_and_the_engine_goes_on():
    stream, _ = _stream()

    def broken(ids, **k):
        raise RuntimeError("tokenizer broke")

    good = stream.gen.tokenizer.decode
    stream.gen.tokenizer.decode = broken
    with pytest.raises(RuntimeError, match="tokenizer broke"):
        stream.generate([PromptRequest(0, [1], "", seed=1)])
    stream.gen.tokenizer.decode = good
    assert stream.thread.is_alive() and len(stream.generate([PromptRequest(1, [1], "", seed=2)])) == 2
    stream.close()
