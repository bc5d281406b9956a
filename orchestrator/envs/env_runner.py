"""Run environments off the event loop under a per-step timeout; a failing env ends only its episode.

`EnvRunner` is what the agent loop (agent_loop.py) awaits for every `make` / `reset` / `step`:

    runner = EnvRunner(resolve_env_factory("guessing"), {}, num_workers=4, step_timeout_s=5.0)
    env = await runner.make()
    messages = await runner.reset(env, sample)
    step = await runner.step(env, "50")          # EnvStep, or raises EnvFailure

Each call runs in its own daemon thread; at most `num_workers` calls run at once (a semaphore).
An exception inside the env, an invalid return value, or a call that takes longer than
`step_timeout_s` raises `EnvFailure` (kind "error" or "timeout") and is counted in `stats`; the
agent loop then ends that episode with ``info["error"]`` and carries on with the others.

What happens to a hung env's thread: Python cannot kill a thread. The runner stops waiting for
it, releases its concurrency slot, counts it in `stats.stuck_threads`, and never calls that env
instance again. The thread keeps running until the env's code returns on its own (its result is
then dropped); because it is a daemon thread it does not keep the process alive at exit. An env
that can hang for ever while holding the GIL in C code would still stall the process; such envs
belong in a separate process: `env.placement=actor` (env_pool.py `ActorEnvRunner`, actors/env_actor.py).
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from orchestrator.envs.env import EnvStep, Environment, Message, as_messages, check_step


class EnvFailure(Exception):
    """An environment call raised, returned something invalid, or timed out.

    kind: "error" or "timeout"; where: "make", "reset" or "step"; message: what happened.
    """

    def __init__(self, kind: str, where: str, message: str):
        super().__init__(f"env {where} {kind}: {message}")
        self.kind, self.where, self.message = kind, where, message


@dataclass
class EnvStats:
    """Counters over a runner's lifetime (read them, or `reset_window()` per rollout step).

    calls: env calls finished or abandoned; errors / timeouts: failed calls by kind;
    step_seconds: wall seconds of each successful `step` (for ``env/step_s_mean``);
    stuck_threads: abandoned threads still running now.
    """

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    step_seconds: list = field(default_factory=list)
    stuck_threads: int = 0


class EnvRunnerLike(Protocol):
    """What the agent loop needs of a runner: `EnvRunner` (threads) or `ActorEnvRunner` (env actors, env_pool.py).

    ``make()`` returns an env token passed back to ``reset`` / ``step`` / ``close``; make/reset/step raise
    EnvFailure; ``close`` (not awaited) ends the episode's env; ``stats`` is an `EnvStats`.
    """

    stats: EnvStats

    async def make(self) -> Any: ...

    async def reset(self, env: Any, sample: dict) -> list[Message]: ...

    async def step(self, env: Any, action: str) -> EnvStep: ...

    def close(self, env: Any) -> None: ...


class EnvRunner:
    """Calls env methods in daemon threads, `num_workers` at a time, each under `step_timeout_s`.

    Args:
        factory: the env class (see env.resolve_env_factory); called as ``factory(**kwargs)``.
        kwargs: constructor keyword arguments (`EnvConfig.kwargs`).
        num_workers: concurrent env calls (>= 1).
        step_timeout_s: seconds one make/reset/step may take (> 0).
        default_role: the role of observations given as plain strings.
    Raises:
        ValueError: for num_workers < 1 or step_timeout_s <= 0.
    """

    def __init__(self, factory: Callable[..., Environment], kwargs: dict | None = None, *,
                 num_workers: int = 4, step_timeout_s: float = 10.0, default_role: str = "user"):
        if num_workers < 1:
            raise ValueError(f"env.num_workers={num_workers}: need >= 1")
        if not step_timeout_s > 0:
            raise ValueError(f"env.step_timeout_s={step_timeout_s}: need > 0")
        self.factory, self.kwargs = factory, dict(kwargs or {})
        self.num_workers, self.step_timeout_s, self.default_role = num_workers, step_timeout_s, default_role
        self.stats = EnvStats()
        self._slots: tuple | None = None
        self._lock = threading.Lock()
        self._finished: set = set()  # threads whose env call returned and whose result is being delivered
        self._abandoned: set = set()  # threads still running after their call timed out (stats.stuck_threads)

    async def make(self) -> Environment:
        """A new env instance (constructor run in a thread). Raises EnvFailure."""
        return await self._call("make", lambda: self.factory(**self.kwargs))

    async def reset(self, env: Environment, sample: dict) -> list[Message]:
        """The episode's opening messages (normalised by `as_messages`). Raises EnvFailure."""
        return await self._call("reset", lambda: as_messages(env.reset(sample), self.default_role))

    async def step(self, env: Environment, action: str) -> EnvStep:
        """One env step, validated by `check_step`; its observation normalised unless done. Raises EnvFailure."""
        def run() -> tuple[EnvStep, float]:
            t0 = time.perf_counter()
            result = check_step(env.step(action))
            if not result.done:
                result = result._replace(observation=as_messages(result.observation, self.default_role))
            return result, time.perf_counter() - t0
        result, seconds = await self._call("step", run)
        self.stats.step_seconds.append(seconds)  # time inside the env, not waiting for a slot
        return result

    def close(self, env: Environment) -> None:
        """The episode is over; nothing to do for a thread-run env (it is garbage-collected)."""

    async def _call(self, where: str, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:  # one semaphore per event loop
            self._slots = (loop, asyncio.Semaphore(self.num_workers))
        async with self._slots[1]:
            future: asyncio.Future = loop.create_future()
            thread = threading.Thread(target=self._thread_main, args=(loop, future, fn),
                                      name=f"env-{where}", daemon=True)
            thread.start()
            try:
                return await asyncio.wait_for(future, timeout=self.step_timeout_s)
            except asyncio.TimeoutError:
                with self._lock:
                    self.stats.timeouts += 1
                    if thread not in self._finished:
                        self.stats.stuck_threads += 1
                        self._abandoned.add(thread)
                raise EnvFailure("timeout", where, f"took longer than env.step_timeout_s={self.step_timeout_s}") from None
            except EnvFailure:
                self.stats.errors += 1
                raise
            finally:
                self.stats.calls += 1
                with self._lock:
                    self._finished.discard(thread)

    def _thread_main(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future, fn: Callable[[], Any]) -> None:
        try:
            outcome: tuple = ("ok", fn())
        except Exception as e:  # the env's own exception, reported to the loop as an EnvFailure
            outcome = ("error", f"{type(e).__name__}: {e}")
        with self._lock:
            me = threading.current_thread()
            if me in self._abandoned:
                self._abandoned.discard(me)
                self.stats.stuck_threads -= 1
                return
            self._finished.add(me)
        try:
            loop.call_soon_threadsafe(_settle, future, outcome, threading.current_thread().name)
        except RuntimeError:  # the event loop is closed: nobody waits for this result any more
            pass


def _settle(future: asyncio.Future, outcome: tuple, name: str) -> None:
    if future.done():  # cancelled or timed out meanwhile
        return
    status, value = outcome
    if status == "ok":
        future.set_result(value)
    else:
        future.set_exception(EnvFailure("error", name.removeprefix("env-"), value))
