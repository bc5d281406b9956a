"""Environments as Ray actors (env.placement=actor), local Ray, no vLLM: the agent loop (a fake binary-searching
engine, the real chat template) over an `ActorEnvRunner` of four `EnvActor`s, each in its own bundle of a placement
group (as the job places them; a replacement goes back into its slot's bundle). One env hangs at its second step,
one calls os._exit, one segfaults: only those episodes end (env_error, the first turn's reward kept), each
actor is killed (the hung one's process is gone) and replaced (env/actor_restarts), the counts are right, the
normal episode finishes; a second rollout on the replaced actors finishes every episode."""
from __future__ import annotations

import os
import time

import pytest
import ray

from actors.env_actor import make_env_runner
from orchestrator.placement.groups import bundle_options, remove_groups, reserve_groups
from orchestrator.placement.plan import GroupPlan
from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.rollout.chat_render import ChatRenderer
from orchestrator.rollout.router import StickyRouter
from tests.unit.test_multiturn_agent_loop import BinarySearchEngine, tok  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration
ENV = {"name": "tests.integration.multiturn_envs:FaultyGuessingEnv", "kwargs": {"max_turns": 8}, "num_workers": 2,
       "step_timeout_s": 3.0, "placement": "actor", "num_actors": 4, "actor_cpus": 0.1}


def _gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_hung_and_crashing_env_actors_end_only_their_episodes(ray_local, tok):  # noqa: F811
    cpus = [0.1 + 0.01 * i for i in range(4)]  # bundle i asks a CPU amount of its own: where an actor sits shows
    pg = reserve_groups([GroupPlan("env-actors-test", [{"CPU": c} for c in cpus], "PACK")], timeout_s=60)[0]
    runner = make_env_runner(ENV, [bundle_options(pg, i, {"CPU": c}) for i, c in enumerate(cpus)])
    loop = AgentLoop(BinarySearchEngine(tok, delay_s=lambda tag, turn: 0.0), runner, ChatRenderer(tok, "strict"),
                     StickyRouter(1), AgentLoopConfig(max_turns=8, max_tokens=1024, max_new_tokens=8))
    try:
        pids = ray.get([s.handle.pid.remote() for s in runner.slots])
        modes = ["hang", "exit", "segv", "ok"]  # episode k goes to actor k (fewest open episodes)
        groups = [GroupRequest(g, {"tag": g, "secret": 100, "mode": m}, n=1) for g, m in enumerate(modes)]
        t0 = time.perf_counter()
        trajectories, m = loop.run_sync(groups)
        took = time.perf_counter() - t0
        assert [t.group_id for t in trajectories] == [0, 1, 2, 3]
        for t in trajectories[:3]:  # first turn played (reward kept), the second step failed
            assert t.stop_reason == "env_error" and t.num_turns == 2
        assert "timeout" in trajectories[0].env_error and "killed and replaced" in trajectories[0].env_error
        assert all("died" in t.env_error for t in trajectories[1:3])
        assert trajectories[3].stop_reason == "done" and trajectories[3].reward == 1.0 and trajectories[3].num_turns == 7
        assert (m["env/errors"], m["env/timeouts"], m["env/actor_restarts"], m["env/reset_failures"]) == (3, 1, 3, 0)
        assert took < 30  # the hang cost one step_timeout_s, not more
        assert _gone(pids[0]) and _gone(pids[1]) and _gone(pids[2])  # the hung actor was killed, not abandoned
        assert [s.generation for s in runner.slots] == [1, 1, 1, 0]
        new_pids = ray.get([s.handle.pid.remote() for s in runner.slots])
        assert new_pids[3] == pids[3] and not set(new_pids[:3]) & set(pids)
        placed = ray.get([s.handle.placement.remote() for s in runner.slots])  # replacements in their bundles
        assert placed == [(pg.id.hex(), {"CPU": pytest.approx(c)}) for c in cpus]

        again = [GroupRequest(10 + g, {"tag": 10 + g, "secret": 50}, n=2) for g in range(4)]
        trajectories, m = loop.run_sync(again)  # on the replaced actors: every episode finishes
        assert len(trajectories) == 8 and all(t.stop_reason == "done" and t.reward == 1.0 for t in trajectories)
        assert (m["env/errors"], m["env/actor_restarts"]) == (0, 0)
        assert all(s.open == 0 for s in runner.slots)  # every episode's env closed
    finally:
        runner.shutdown()
        remove_groups([pg])
