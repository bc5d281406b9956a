"""Streamed multi-turn episodes on the streaming engine thread (actors/rollout/stream.py, stream_episodes.py) over a
fake vLLM engine that samples one token per step: the episodes' turns share the engine thread with nothing
blocking it, a pause (the weight sync) interrupts turns in flight and they continue on the new version, every
episode of every group comes back once through `drain` with non-decreasing versions, and a failed reset fails the
next drain with a message naming env.name. The real engine: tests/integration/test_partial_rollout_multiturn.py.

    .venv/bin/python -m pytest tests/unit/test_stream_episodes.py -q
"""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from actors.rollout.stream import StreamingGenerator
from actors.rollout.stream_episodes import StreamingEpisodes
from orchestrator.rollout.env import EnvStep
from orchestrator.rollout.env_runner import EnvFailure
from orchestrator.rollout.types import PromptRequest

ENV = {"name": "fake", "max_turns": 3, "max_tokens": 200}


class _LLMEngine:
    """add_request / step / abort_request of vLLM's LLMEngine: one token (id 5, logprob -0.5) per request a step."""

    def __init__(self):
        self.requests: dict[str, list] = {}  # request id -> [tokens left]

    def add_request(self, rid, prompt, params):
        self.requests[rid] = [params.max_tokens]

    def abort_request(self, ids):
        for rid in ids:
            self.requests.pop(rid, None)

    def step(self):
        time.sleep(0.002)
        out = []
        for rid, left in list(self.requests.items()):
            left[0] -= 1
            done = left[0] == 0
            completion = SimpleNamespace(token_ids=[5], logprobs=[{5: SimpleNamespace(logprob=-0.5)}],
                                         finish_reason="length" if done else None)
            out.append(SimpleNamespace(request_id=rid, outputs=[completion], finished=done))
            if done:
                del self.requests[rid]
        return out


class _Envs:
    def __init__(self, fail_reset: bool = False):
        self.fail_reset = fail_reset
        self.stats = SimpleNamespace(errors=0, timeouts=0, step_seconds=[], stuck_threads=0)

    async def make(self):
        return object()

    async def reset(self, env, sample):
        if self.fail_reset:
            raise EnvFailure("error", "reset", "reset failed")
        return [{"role": "user", "content": "hi"}]

    async def step(self, env, action):
        await asyncio.sleep(0.01)  # a slow environment: the engine keeps stepping the other episodes' turns
        return EnvStep("more", 1.0, False, {})

    def close(self, env):
        pass


def _episodes(envs: _Envs):
    engine = SimpleNamespace(llm=SimpleNamespace(llm_engine=_LLMEngine()), tokenizer=SimpleNamespace(),
                             cfg=SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=6, ignore_eos=False))
    holder = {"version": 0}
    stream = StreamingGenerator(engine, 2, 6, lambda: holder["version"])
    session = SimpleNamespace(prompt_ids=[1, 2], action_text=lambda ids: "a", observation_ids=lambda c, i, m: [7, 7])
    multiturn = SimpleNamespace(configure=lambda cfg: None, runner=envs,
                                tokenizer=SimpleNamespace(decode=lambda ids, **k: "t"), renderer=SimpleNamespace(start=lambda messages: session))
    return stream, StreamingEpisodes(stream, multiturn, n=2, max_new_tokens=6, worker_id=1), holder


def test_turns_stream_a_pause_interrupts_them_and_every_episode_returns_once():
    stream, episodes, holder = _episodes(_Envs())
    assert episodes.submit([PromptRequest(g, [], "", prompt="p") for g in range(3)], ENV) == 6
    deadline = time.monotonic() + 20
    while holder["version"] == 0 and time.monotonic() < deadline:  # the weight sync, once it lands inside a turn
        with stream.paused():
            if stream.gen.interruptions:
                holder["version"] = 1
    samples = []
    while len(samples) < 6 and time.monotonic() < deadline:
        samples += stream.drain(0.5)[0]
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


def test_a_failed_reset_fails_the_next_drain_naming_env_name():
    stream, episodes, _ = _episodes(_Envs(fail_reset=True))
    episodes.submit([PromptRequest(0, [], "")], ENV)
    with pytest.raises(RuntimeError, match="env.name='fake'"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stream.drain(0.1)
    episodes.close()
    stream.close()
