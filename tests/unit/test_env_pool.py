"""Environments in a pool of actors (env.placement=actor), without Ray: `ActorEnvRunner` over fake actor handles
whose methods run an `EnvHost` in this process (orchestrator/envs/env_pool.py), the config keys, and the plan's
env bundles (orchestrator/placement/plan.py)."""
from __future__ import annotations

import asyncio

import pytest

from orchestrator.config import load_config
from orchestrator.placement.plan import plan_job
from orchestrator.envs.env_config import EnvConfig, validate_env_config
from orchestrator.envs.env_pool import ActorEnvRunner, EnvHandle, EnvHost
from orchestrator.envs.env_runner import EnvFailure

CPU_YAML = "configs/grpo_guessing_cpu.yaml"


class CountEnv:
    """Rewards 1 per step; the action "raise" raises, "hang" never returns (in the fake actor), "die" kills it."""

    def __init__(self, turns: int = 3):
        self.turns, self.t = turns, 0

    def reset(self, sample):
        return f"start {sample['seed']}"

    def step(self, action):
        if action == "raise":
            raise ValueError("bad move")
        self.t += 1
        return "next", 1.0, self.t >= self.turns, {}


class _Method:
    def __init__(self, actor, name):
        self.actor, self.name = actor, name

    def remote(self, *args):
        if self.name == "close":  # fire and forget (the runner does not await it): runs now
            self.actor.calls.append("close")
            return None if self.actor.killed else self.actor.host.close(*args)
        return self.actor.run(self.name, args)


class FakeActor:
    """An actor handle: ``handle.step.remote(...)`` is awaitable; a "hang" step sleeps, "die" raises as Ray does."""

    def __init__(self, slot):
        self.slot, self.host, self.killed, self.calls = slot, EnvHost(CountEnv, {"turns": 3}), False, []

    def __getattr__(self, name):
        return _Method(self, name)

    async def run(self, name, args):
        self.calls.append(name)
        if self.killed:
            raise RuntimeError("RayActorError: the actor is dead")
        if name == "ready":
            await asyncio.sleep(60 if self.slot == "stuck" else 0)
            return ("ok", True)
        if name == "step" and args[1] == "hang":
            await asyncio.sleep(60)
        if name == "step" and args[1] == "die":
            self.killed = True
            raise RuntimeError("RayActorError: the actor died unexpectedly (os._exit)")
        return getattr(self.host, name)(*args)


class Pool:
    def __init__(self):
        self.spawned, self.killed = [], []

    def spawn(self, slot):
        self.spawned.append(FakeActor(slot))
        return self.spawned[-1]

    def kill(self, handle):
        handle.killed = True
        self.killed.append(handle)


def runner(n=2, timeout_s=0.3):
    pool = Pool()
    return ActorEnvRunner(pool.spawn, pool.kill, num_actors=n, step_timeout_s=timeout_s), pool


def run(coro):
    return asyncio.run(coro)


def test_an_episode_runs_in_the_actor_and_the_rollout_side_holds_only_ids():
    r, pool = runner()

    async def episode():
        env = await r.make()
        opening = await r.reset(env, {"seed": 7})
        steps = [await r.step(env, "a") for _ in range(3)]
        return env, opening, steps

    env, opening, steps = run(episode())
    assert isinstance(env, EnvHandle) and env == EnvHandle(0, 0, 1)
    assert opening == [{"role": "user", "content": "start 7"}]
    assert [s.done for s in steps] == [False, False, True] and steps[0].observation == [{"role": "user", "content": "next"}]
    assert pool.spawned[0].host.envs  # the env object lives in the actor
    r.close(env)
    assert pool.spawned[0].host.envs == {} and r.slots[0].open == 0
    assert (r.stats.calls, r.stats.errors, r.stats.timeouts, r.stats.actor_restarts) == (5, 0, 0, 0)
    assert len(r.stats.step_seconds) == 3


def test_make_goes_to_the_actor_with_fewest_open_episodes():
    r, _ = runner(n=3)

    async def make(k):
        return [await r.make() for _ in range(k)]

    envs = run(make(4))
    assert [e.slot for e in envs] == [0, 1, 2, 0]
    r.close(envs[1])
    assert run(r.make()).slot == 1


def test_an_env_error_ends_the_episode_and_keeps_the_actor():
    r, pool = runner()

    async def go():
        env = await r.make()
        await r.reset(env, {"seed": 1})
        with pytest.raises(EnvFailure, match="ValueError: bad move") as e:
            await r.step(env, "raise")
        return e.value

    failure = run(go())
    assert (failure.kind, failure.where) == ("error", "step")
    assert r.stats.errors == 1 and r.stats.actor_restarts == 0 and pool.killed == []


def test_a_hung_step_times_out_the_actor_is_replaced_and_only_its_episodes_end():
    r, pool = runner(n=2)

    async def go():
        hung, other = await r.make(), await r.make()  # slots 0 and 1
        neighbour = await r.make()  # slot 0 again: shares the hung env's actor
        assert (hung.slot, other.slot, neighbour.slot) == (0, 1, 0)
        for env in (hung, neighbour, other):
            await r.reset(env, {"seed": 0})
        with pytest.raises(EnvFailure) as timeout:
            await r.step(hung, "hang")
        with pytest.raises(EnvFailure, match="replaced"):
            await r.step(neighbour, "a")
        assert (await r.step(other, "a")).reward == 1.0  # the other actor's episode goes on
        fresh = await r.make()
        await r.reset(fresh, {"seed": 2})
        return timeout.value, fresh, await r.step(fresh, "a")

    failure, fresh, step = run(go())
    assert (failure.kind, failure.where) == ("timeout", "step") and "env.step_timeout_s=0.3" in str(failure)
    assert pool.killed == [pool.spawned[0]] and len(pool.spawned) == 3  # slot 0 respawned once
    assert r.slots[0].handle is pool.spawned[2] and r.slots[0].generation == 1
    assert fresh.generation == 1 and step.reward == 1.0
    assert (r.stats.timeouts, r.stats.errors, r.stats.actor_restarts) == (1, 1, 1)


def test_a_dead_actor_is_replaced_once_however_many_calls_saw_it_die():
    r, pool = runner(n=1, timeout_s=5.0)

    async def go():
        a, b = await r.make(), await r.make()
        await r.reset(a, {"seed": 0})
        await r.reset(b, {"seed": 0})
        results = await asyncio.gather(r.step(a, "die"), r.step(b, "a"), return_exceptions=True)
        c = await r.make()
        await r.reset(c, {"seed": 0})
        return results, await r.step(c, "a")

    results, step = run(go())
    assert isinstance(results[0], EnvFailure) and "died" in str(results[0]) and results[0].kind == "error"
    assert step.reward == 1.0
    assert r.stats.actor_restarts == 1 and len(pool.spawned) == 2 and r.stats.timeouts == 0
    r.shutdown()
    assert pool.spawned[1].killed


def test_env_host_reports_env_errors_as_values():
    host = EnvHost(CountEnv, {"turns": 1})
    status, env_id = host.make()
    assert status == "ok" and host.reset(env_id, {}) [0] == "error"  # KeyError 'seed', not raised
    assert host.step(env_id, "raise") == ("error", "ValueError: bad move")
    status, (step, seconds) = host.step(env_id, "a")
    assert status == "ok" and step[2] is True and seconds >= 0
    assert host.step(99, "a")[0] == "error" and host.close(env_id) == ("ok", None) and host.envs == {}
    assert EnvHost(CountEnv, {"nope": 1}).make()[0] == "error"


def test_env_placement_keys_are_validated():
    validate_env_config(EnvConfig(name="guessing", placement="actor", num_actors=2, actor_cpus=0.25))
    for cfg, key in [(EnvConfig(placement="process"), "env.placement='process'"),
                     (EnvConfig(num_actors=0), "env.num_actors=0"), (EnvConfig(actor_cpus=0), "env.actor_cpus=0")]:
        with pytest.raises(ValueError, match=key.replace("(", r"\(")):
            validate_env_config(cfg)
    with pytest.raises(ValueError, match="env.placement"):
        load_config(CPU_YAML, ["env.placement=threads"])


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_env_actors_get_cpu_bundles_in_the_job_group(mode):
    over = [f"placement.mode={mode}", "rollout.num_workers=2"]
    thread = plan_job(load_config(CPU_YAML, over), pin=False)
    assert "env" not in thread.slots  # thread placement: the plan is unchanged
    plan = plan_job(load_config(CPU_YAML, over + ["env.placement=actor", "env.num_actors=2", "env.actor_cpus=0.5"]),
                    pin=False)
    job = plan.groups[0]
    assert job.bundles[:len(thread.groups[0].bundles)] == thread.groups[0].bundles  # appended after the others
    env = plan.slots["env"]
    assert len(env) == 4 and [s.bundle for s in env] == list(range(len(job.bundles) - 4, len(job.bundles)))
    assert all(job.bundles[s.bundle] == {"CPU": 0.5} and s.resources == {"CPU": 0.5} and s.group == 0 for s in env)


def test_spawner_options_use_the_bundle_or_ask_for_cpus():
    from actors.env_actor import EnvActorSpawner

    bundle = {"scheduling_strategy": "pg-bundle-3", "num_cpus": 0.5, "num_gpus": 0}
    spawner = EnvActorSpawner("guessing", {}, num_workers=3, actor_cpus=0.5, bundles=[bundle])
    assert spawner.options(0) == {**bundle, "max_concurrency": 3}
    assert spawner.options(1) == {"num_cpus": 0.5, "max_concurrency": 3}  # no bundle: Ray places it


def test_each_rollout_worker_gets_the_bundles_of_its_own_env_actors():
    from orchestrator.placement.groups import env_actor_options

    cfg = load_config(CPU_YAML, ["rollout.num_workers=2", "env.placement=actor", "env.num_actors=2",
                                 "env.actor_cpus=0.5"])
    plan = plan_job(cfg, pin=False)
    pg = object()  # stands for the job's placement group
    second = env_actor_options(plan.slots["env"], [pg], 1, cfg.env.num_actors)
    assert [o["scheduling_strategy"].placement_group_bundle_index for o in second] == [s.bundle for s in plan.slots["env"][2:]]
    assert all(o["scheduling_strategy"].placement_group is pg and o["num_cpus"] == 0.5 for o in second)
    assert env_actor_options([], [pg], 0, 1) == []  # thread placement: no env bundles


def test_an_actor_that_does_not_start_fails_the_make_and_is_replaced():
    pool, starts = Pool(), iter(["stuck"])
    spawn = lambda slot: pool.spawn(next(starts, slot))  # noqa: E731 - the first actor never comes up
    r = ActorEnvRunner(spawn, pool.kill, num_actors=1, step_timeout_s=5.0, start_timeout_s=0.2)

    async def go():
        with pytest.raises(EnvFailure, match="did not start within 0.2 s") as e:
            await r.make()
        return e.value, await r.make()

    failure, env = run(go())
    assert failure.kind == "timeout" and env == EnvHandle(0, 1, 1) and r.slots[0].open == 1
    assert (r.stats.timeouts, r.stats.actor_restarts) == (1, 1) and pool.killed == [pool.spawned[0]]
    with pytest.raises(ValueError, match="env.num_actors=0"):
        ActorEnvRunner(spawn, pool.kill, num_actors=0)
