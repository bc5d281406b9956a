"""Environments in a pool of Ray actors (`env.placement=actor`): the rollout side holds only ids.

`ActorEnvRunner` has the interface of `EnvRunner` (env_runner.py: ``make`` / ``reset`` / ``step`` / ``close`` /
``stats``), so the agent loop does not know where its environments live:

    runner = ActorEnvRunner(spawn, kill, num_actors=2, step_timeout_s=5.0)
    env = await runner.make()                   # an EnvHandle (actor slot, actor generation, env id)
    messages = await runner.reset(env, sample)
    step = await runner.step(env, "50")         # EnvStep, or raises EnvFailure
    runner.close(env)                           # the actor drops the env instance

`spawn(slot)` starts the actor of pool slot `slot` and returns its handle; `kill(handle)` ends it (Ray:
actors/env_actor.py `EnvActorSpawner`). A handle's methods are called as ``handle.method.remote(*args)`` and the
result awaited; the actor methods (``ready``, ``make``, ``reset``, ``step``, ``close``) return
``("ok", value)`` or ``("error", message)`` and raise nothing of the env's own, so an exception while awaiting
means the actor is gone (crash, ``os._exit``, segfault, node loss).

Failures, each ending only the episodes on that actor:
- an env call that raises or returns something invalid: EnvFailure("error"); the actor keeps running;
- a call longer than `step_timeout_s`: EnvFailure("timeout"); the actor is killed and replaced (it may be stuck
  in C code; killing its process is the only sure way to stop it);
- the actor dies: EnvFailure("error"); it is replaced.
Episodes whose env lived on a replaced actor fail at their next call (EnvFailure "error", "actor replaced").
`stats.actor_restarts` counts replacements. Waiting for a (re)started actor to come up is not part of any
call's timeout (it has its own, `start_timeout_s`).
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable

from orchestrator.envs.env import EnvStep, Message, as_messages, check_step
from orchestrator.envs.env_runner import EnvFailure, EnvStats


@dataclass
class ActorEnvStats(EnvStats):
    """`EnvStats` plus actor_restarts: env actors killed (timeout) or found dead, and replaced."""

    actor_restarts: int = 0


@dataclass(frozen=True)
class EnvHandle:
    """One environment instance: pool `slot`, the `generation` of the slot's actor that holds it, its `env_id`."""

    slot: int
    generation: int
    env_id: int


@dataclass
class _Slot:
    handle: Any
    generation: int = 0
    ready: bool = False
    open: int = 0  # episodes made on this generation and not closed


class ActorEnvRunner:
    """Makes and steps environments inside a pool of actors (see the module docstring).

    Args:
        spawn: ``spawn(slot: int) -> actor handle``, starts the actor of one pool slot.
        kill: ``kill(handle) -> None``, ends an actor (must not raise when it is already dead).
        num_actors: pool size (>= 1).
        step_timeout_s: seconds one make/reset/step may take (> 0).
        start_timeout_s: seconds a (re)started actor may take to come up (> 0).
    Raises:
        ValueError: for num_actors < 1 or a timeout <= 0.
    """

    def __init__(self, spawn: Callable[[int], Any], kill: Callable[[Any], None], *, num_actors: int = 1,
                 step_timeout_s: float = 10.0, start_timeout_s: float = 120.0):
        if num_actors < 1:
            raise ValueError(f"env.num_actors={num_actors}: need >= 1")
        if not step_timeout_s > 0 or not start_timeout_s > 0:
            raise ValueError(f"env.step_timeout_s={step_timeout_s}, start timeout {start_timeout_s}: need > 0")
        self.spawn, self.kill = spawn, kill
        self.step_timeout_s, self.start_timeout_s = step_timeout_s, start_timeout_s
        self.stats = ActorEnvStats()
        self.slots = [_Slot(spawn(i)) for i in range(num_actors)]

    async def make(self) -> EnvHandle:
        """A new env instance on the actor with the fewest open episodes. Raises EnvFailure."""
        index = min(range(len(self.slots)), key=lambda i: (self.slots[i].open, i))
        slot = self.slots[index]
        gen = slot.generation
        slot.open += 1
        try:
            env_id = await self._call(EnvHandle(index, gen, -1), "make")
        except EnvFailure:
            self._release(index, gen)
            raise
        return EnvHandle(index, gen, int(env_id))

    async def reset(self, env: EnvHandle, sample: dict) -> list[Message]:
        """The episode's opening messages (normalised inside the actor). Raises EnvFailure."""
        return await self._call(env, "reset", env.env_id, sample)

    async def step(self, env: EnvHandle, action: str) -> EnvStep:
        """One env step, validated and normalised inside the actor. Raises EnvFailure."""
        result, seconds = await self._call(env, "step", env.env_id, action)
        self.stats.step_seconds.append(float(seconds))  # time inside the env, measured in the actor
        return EnvStep(*result)

    def close(self, env: EnvHandle) -> None:
        """The episode is over: the actor drops the env (not waited for; nothing to do on a replaced actor)."""
        slot = self.slots[env.slot]
        if slot.generation == env.generation:
            try:
                slot.handle.close.remote(env.env_id)
            except Exception:  # noqa: BLE001 - a dead actor is found (and replaced) by the next call
                pass
        self._release(env.slot, env.generation)

    def shutdown(self) -> None:
        """Kill every actor of the pool."""
        for slot in self.slots:
            self.kill(slot.handle)

    def _release(self, index: int, generation: int) -> None:
        slot = self.slots[index]
        if slot.generation == generation:
            slot.open = max(slot.open - 1, 0)

    async def _call(self, env: EnvHandle, method: str, *args) -> Any:
        slot = self.slots[env.slot]
        if slot.generation != env.generation:
            self.stats.calls += 1
            self.stats.errors += 1
            raise EnvFailure("error", method, f"its env actor (slot {env.slot}) was replaced after a failure")
        try:
            if not slot.ready:
                started = await self._started(slot)
                if not started:
                    self.stats.timeouts += 1
                    self._replace(env.slot, env.generation)
                    raise EnvFailure("timeout", method, f"env actor {env.slot} did not start within "
                                                        f"{self.start_timeout_s:g} s; replaced")
            outcome = await self._await(getattr(slot.handle, method).remote(*args), self.step_timeout_s)
        except EnvFailure:
            raise
        except asyncio.TimeoutError:
            self.stats.timeouts += 1
            self._replace(env.slot, env.generation)
            raise EnvFailure("timeout", method, f"took longer than env.step_timeout_s={self.step_timeout_s:g}; "
                                                f"env actor {env.slot} killed and replaced") from None
        except Exception as e:  # noqa: BLE001 - the actor died (RayActorError and kin): replace it
            self.stats.errors += 1
            self._replace(env.slot, env.generation)
            raise EnvFailure("error", method, f"env actor {env.slot} died ({type(e).__name__}: {e}); "
                                              "replaced") from None
        finally:
            self.stats.calls += 1
        status, value = outcome
        if status != "ok":
            self.stats.errors += 1
            raise EnvFailure("error", method, str(value))
        return value

    async def _started(self, slot: _Slot) -> bool:
        """Wait (up to start_timeout_s) for a new actor to come up; False on timeout (a dead one raises)."""
        try:
            await self._await(slot.handle.ready.remote(), self.start_timeout_s)
        except asyncio.TimeoutError:
            return False
        slot.ready = True
        return True

    @staticmethod
    async def _await(ref, timeout: float) -> Any:
        async def wait():
            return await ref
        return await asyncio.wait_for(wait(), timeout=timeout)

    def _replace(self, index: int, generation: int) -> None:
        """Kill and respawn the actor of `index` unless another failure already replaced that generation."""
        slot = self.slots[index]
        if slot.generation != generation:
            return
        self.kill(slot.handle)
        self.slots[index] = _Slot(self.spawn(index), generation + 1)
        self.stats.actor_restarts += 1


class EnvHost:
    """The env instances of one env actor, by id (the logic of actors/env_actor.py `EnvActor`, without Ray).

    Every method returns ``("ok", value)`` or ``("error", "Type: message")``; the env's own exceptions never
    escape, so the runner can tell an env error from a dead actor.

    Args:
        factory: the env class (env.resolve_env_factory); called as ``factory(**kwargs)``.
        kwargs: constructor keyword arguments (`EnvConfig.kwargs`).
        default_role: the role of observations given as plain strings.
    """

    def __init__(self, factory: Callable[..., Any], kwargs: dict | None = None, default_role: str = "user"):
        self.factory, self.kwargs, self.default_role = factory, dict(kwargs or {}), default_role
        self.envs: dict[int, Any] = {}
        self._ids = itertools.count(1)  # next() is atomic: the actor runs calls in threads

    def make(self) -> tuple:
        """("ok", env id: int) of a new instance."""
        def build() -> int:
            env, env_id = self.factory(**self.kwargs), next(self._ids)
            self.envs[env_id] = env
            return env_id
        return _guard(build)

    def reset(self, env_id: int, sample: dict) -> tuple:
        """("ok", [Message]) the episode's opening messages."""
        return _guard(lambda: as_messages(self.envs[env_id].reset(sample), self.default_role))

    def step(self, env_id: int, action: str) -> tuple:
        """("ok", (EnvStep as a tuple, seconds inside env.step)), the observation normalised unless done."""
        def run() -> tuple:
            t0 = time.perf_counter()
            result = check_step(self.envs[env_id].step(action))
            if not result.done:
                result = result._replace(observation=as_messages(result.observation, self.default_role))
            return tuple(result), time.perf_counter() - t0
        return _guard(run)

    def close(self, env_id: int) -> tuple:
        """("ok", None); drops the instance (unknown ids are ignored)."""
        self.envs.pop(env_id, None)
        return ("ok", None)


def _guard(fn: Callable[[], Any]) -> tuple:
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the env's own exception, reported to the runner as an EnvFailure
        return ("error", f"{type(e).__name__}: {e}")
