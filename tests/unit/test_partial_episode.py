"""Streamed multi-turn episodes, pure parts (orchestrator/rollout/partial_episode.py): the agent loop records the
weight version of every sampled id when the engine reports it (observation ids: -1, masked), an episode's
staleness is its oldest sampled id's, the group buffer takes episode groups like single-turn groups (and drops
them over the bound), and the controller hands the env section to the workers with every multi-turn group.

    .venv/bin/python -m pytest tests/unit/test_partial_episode.py -q
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.envs.env import EnvStep
from orchestrator.rollout.multi_turn_source import group_request
from orchestrator.rollout.multiturn import TrajectoryBuilder
from orchestrator.rollout.partial_episode import EpisodeSample
from orchestrator.rollout.router import StickyRouter
from orchestrator.rollout.stream_buffer import GroupBuffer
from orchestrator.rollout.stream_source import StreamRollouts
from orchestrator.rollout.types import PromptRequest


def _episode(group_id: int, index: int, versions: tuple[list, list]):
    b = TrajectoryBuilder(group_id, [1, 2], sample_index=index)
    b.add_sampled([5, 6], [-0.1, -0.2], versions[0])
    b.add_observation([9, 9, 9])
    b.add_sampled([7], [-0.3], versions[1])
    b.add_reward(0.5)
    return b.finish("done")


def test_episode_versions_are_per_sampled_id_and_observations_are_masked():
    request = PromptRequest(4, [1, 2], "42", prompt="q")
    ep = EpisodeSample(request, _episode(4, 1, ([3, 4], [4])), text="hi", rollout_worker=1)
    assert ep.key == "4:1" and ep.first_version == 3 and ep.num_versions == 2 and ep.finish_reason == "stop"
    t = ep.to_trajectory()
    assert t.token_versions == [3, 4, -1, -1, -1, 4] and t.multiturn.loss_mask == [1, 1, 0, 0, 0, 1]
    assert t.logprobs[2:5] == [0.0, 0.0, 0.0] and t.weight_version == 3
    assert (t.answer, t.prompt, t.text, t.multiturn.rollout_worker, t.multiturn.reward) == ("42", "q", "hi", 1, 0.5)
    plain = TrajectoryBuilder(0, [1])
    plain.add_sampled([5], [-0.1])
    assert plain.finish("done").to_trajectory(2).token_versions == []  # the one-batch path reports no versions
    with pytest.raises(ValueError, match="no sampled id carries a weight version"):
        EpisodeSample(PromptRequest(0, [1], ""), plain.finish("done"))
    with pytest.raises(ValueError, match="handed in for group"):
        EpisodeSample(PromptRequest(5, [1], ""), _episode(4, 0, ([0, 0], [0])))
    with pytest.raises(ValueError, match="token versions"):
        TrajectoryBuilder(0, [1]).add_sampled([5, 6], [-0.1, -0.1], [1])


def test_the_buffer_takes_episode_groups_and_drops_them_over_the_bound():
    buf = GroupBuffer(max_staleness=1, prompts_per_step=1)
    for gid in (0, 1):
        buf.submit(gid, 2)
    old, new = PromptRequest(0, [1, 2], ""), PromptRequest(1, [1, 2], "")
    for i in range(2):  # group 0: oldest token at version 0; group 1: at version 2
        buf.add(EpisodeSample(old, _episode(0, i, ([0, 1], [2]))))
        buf.add(EpisodeSample(new, _episode(1, i, ([2, 2], [3]))))
    batch = buf.take(1, policy_version=3)  # group 0 is 3 > 1 versions behind: dropped
    assert [g.group_id for g in batch.groups] == [1] and buf.dropped_groups == 1
    row = buf.metrics(batch)
    assert row["async/staleness_1"] == 2.0 and row["async/multi_version_samples"] == 2.0


class _VersionedEngine:
    """An AsyncEngine that reports versions: turn t is sampled by version t."""

    def __init__(self):
        self.turn = 0

    async def generate(self, prompt_ids, max_tokens, worker=None, seed=None):
        self.turn += 1
        return [10, 11], [-0.5, -0.5], "stop", [self.turn - 1, self.turn]


class _Env:
    def __init__(self):
        self.stats = SimpleNamespace(errors=0, timeouts=0, step_seconds=[], stuck_threads=0)

    async def make(self):
        return object()

    async def reset(self, env, sample):
        return [{"role": "user", "content": "hi"}]

    async def step(self, env, action):
        return EnvStep("more", 1.0, False, {})

    def close(self, env):
        pass


def test_the_agent_loop_records_the_versions_the_engine_reports():
    session = SimpleNamespace(prompt_ids=[1, 2], action_text=lambda ids: "a",
                              observation_ids=lambda context, ids, obs: [7])
    renderer = SimpleNamespace(start=lambda messages: session)
    loop = AgentLoop(_VersionedEngine(), _Env(), renderer, StickyRouter(1), AgentLoopConfig(max_turns=2))
    (ep,), _ = asyncio.run(loop.run([GroupRequest(3, {}, n=1)]))
    assert ep.token_versions == [0, 1, -1, 1, 2] and ep.loss_mask == [1, 1, 0, 1, 1]
    assert EpisodeSample(PromptRequest(3, [1, 2], ""), ep).first_version == 0


def test_the_controller_hands_multi_turn_groups_to_the_workers_with_the_env_section():
    calls = []
    worker = SimpleNamespace(stream_submit=SimpleNamespace(remote=lambda *a: calls.append(a)))
    cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=1, n=2, max_new_tokens=4),
                          algo=SimpleNamespace(max_staleness=1))
    env = {"name": "guessing", "max_turns": 2, "step_timeout_s": 10.0, "max_failed_frac": 0.5}
    more = lambda step: [PromptRequest(100 + step, [1], "4", prompt="q", seed=step)]  # noqa: E731 - after the take
    rollouts = StreamRollouts([worker], lambda refs: refs, more, None, cfg, env_cfg=env)
    request = PromptRequest(7, [1], "3", prompt="p", seed=11)
    rollouts.submit([request])
    assert calls == [([request], env, 0)] and rollouts.engines.outstanding == [2]
    done = [EpisodeSample(request, _episode(7, i, ([1, 1], [2]))) for i in range(2)]
    worker.stream_drain = SimpleNamespace(remote=lambda wait_s: (done, {"stream/interruptions": 1.0}))
    row = {}
    trajs = rollouts.take(3, 2, row)  # policy version 2: the episodes' oldest tokens are version 1
    assert [t.multiturn.sample_index for t in trajs] == [0, 1] and row["async/staleness_1"] == 2.0
    assert row["rollout/turns_mean"] == 2.0 and row["rollout/sampled_len_mean"] == 3.0 and row["rollout/tokens"] == 12
    assert group_request(request, 2) == GroupRequest(7, {"prompt": "p", "answer": "3", "seed": 7}, 2, 11)
