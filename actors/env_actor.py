"""EnvActor: a Ray actor holding environment instances (`env.placement=actor`), and the spawner of a pool.

The rollout worker's `ActorEnvRunner` (orchestrator/envs/env_pool.py) holds only env ids; the envs live
here, in their own process, so a CPU-heavy env does not slow the engine's process, and an env that hangs in C
code, calls ``os._exit`` or segfaults takes down only this actor (the runner kills and replaces it).

    spawner = EnvActorSpawner("guessing", {}, num_workers=4, actor_cpus=1.0, bundles=[opts0, opts1])
    runner = ActorEnvRunner(spawner.spawn, spawner.kill, num_actors=2, step_timeout_s=10)

Placement: `bundles[i]` are the `.options(...)` of pool slot i (orchestrator/placement/groups.py
`env_actor_options`: a bundle of the job's placement group asking {CPU: env.actor_cpus}, so the actor may sit on
a CPU-only node). A replacement goes into the same bundle once Ray has freed it. Without bundles (an engine
started outside a job, e.g. in tests) the actor asks Ray for `actor_cpus` CPUs anywhere.
"""
from __future__ import annotations

from typing import Any, Optional

import ray

from orchestrator.envs.env import resolve_env_factory
from orchestrator.envs.env_pool import ActorEnvRunner, EnvHost
from orchestrator.envs.env_runner import EnvRunner


@ray.remote(max_restarts=0)
class EnvActor:
    """`EnvHost` in a Ray actor; calls run in up to env.num_workers threads (the actor's max_concurrency)."""

    def __init__(self, name: str, kwargs: dict, default_role: str = "user"):
        self.host = EnvHost(resolve_env_factory(name, "env.name"), kwargs, default_role)

    def ready(self) -> tuple:
        return ("ok", True)

    def make(self) -> tuple:
        return self.host.make()

    def reset(self, env_id: int, sample: dict) -> tuple:
        return self.host.reset(env_id, sample)

    def step(self, env_id: int, action: str) -> tuple:
        return self.host.step(env_id, action)

    def close(self, env_id: int) -> tuple:
        return self.host.close(env_id)

    def placement(self) -> tuple:
        """(placement group id hex or None, {resource: amount} assigned to this actor) - where Ray put it."""
        ctx = ray.get_runtime_context()
        return ctx.get_placement_group_id(), dict(ctx.get_assigned_resources())

    def pid(self) -> int:
        """This actor's process id (fault tests)."""
        import os

        return os.getpid()


class EnvActorSpawner:
    """Starts and kills the env actors of one pool (see the module docstring).

    Args:
        name, kwargs: env.name and env.kwargs.
        num_workers: concurrent calls inside one actor (env.num_workers, its max_concurrency).
        actor_cpus: CPUs an actor asks for when it has no bundle (env.actor_cpus).
        bundles: `.options(...)` per pool slot (placement-group bundles), or None.
    """

    def __init__(self, name: str, kwargs: dict, num_workers: int, actor_cpus: float,
                 bundles: Optional[list[dict]] = None):
        self.name, self.kwargs, self.num_workers, self.actor_cpus = name, dict(kwargs or {}), num_workers, actor_cpus
        self.bundles = list(bundles or [])

    def options(self, slot: int) -> dict:
        """The `.options(...)` of pool slot `slot`: its bundle when there is one, else {num_cpus: actor_cpus}."""
        placed = self.bundles[slot] if slot < len(self.bundles) else {"num_cpus": self.actor_cpus}
        return {**placed, "max_concurrency": self.num_workers}

    def spawn(self, slot: int) -> Any:
        return EnvActor.options(**self.options(slot)).remote(self.name, self.kwargs)

    @staticmethod
    def kill(handle: Any) -> None:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass


def make_env_runner(env_cfg: dict, bundles: Optional[list[dict]] = None):
    """The runner of the `env` section (a dict): `EnvRunner` (threads here) for env.placement=thread, else an
    `ActorEnvRunner` over env.num_actors `EnvActor`s placed in `bundles` (this rollout worker's slots)."""
    timeout_s = float(env_cfg["step_timeout_s"])
    if env_cfg.get("placement", "thread") != "actor":
        return EnvRunner(resolve_env_factory(env_cfg["name"]), dict(env_cfg.get("kwargs") or {}),
                         num_workers=int(env_cfg["num_workers"]), step_timeout_s=timeout_s)
    spawner = EnvActorSpawner(env_cfg["name"], dict(env_cfg.get("kwargs") or {}), int(env_cfg["num_workers"]),
                              float(env_cfg.get("actor_cpus", 1.0)), bundles)
    return ActorEnvRunner(spawner.spawn, spawner.kill, num_actors=int(env_cfg.get("num_actors", 1)),
                          step_timeout_s=timeout_s)
