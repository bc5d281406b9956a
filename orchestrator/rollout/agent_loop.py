"""The multi-turn agent loop: many trajectories in flight at once against an async engine and envs.

Each trajectory is its own coroutine: generate a turn on its group's rollout worker, step its
environment (in a thread or an env actor, under a timeout), append the observation ids, repeat. Nothing waits for
other trajectories between turns, so an engine with continuous batching always has whatever turns
are ready (no lockstep by turn). All samples and turns of a group go to the worker `StickyRouter`
gives the group, so the engine's prefix cache serves the shared prompt and each growing history.

The engine is anything with::

    async def generate(prompt_ids: list[int], max_tokens: int, worker) -> (ids, logprobs, finish_reason)

returning the sampled ids (ending with the end-of-turn id when the model stopped), one logprob per
id, and "stop" or "length" (and optionally a 4th item: the weight version that sampled each id, which the
streaming engine of partial rollouts reports, actors/rollout/stream_episodes.py). The vLLM engine is wired
to it in actors/rollout/stream_episodes.py (`StreamTurns`: one turn = one request on the worker's streaming engine,
for a batch of episodes and for streamed episodes alike).

    loop = AgentLoop(engine, EnvRunner(resolve_env_factory("guessing")), ChatRenderer(tok), StickyRouter(2),
                     AgentLoopConfig(max_turns=8, max_tokens=1024, max_new_tokens=32))
    trajectories, metrics = loop.run_sync([GroupRequest(0, {"seed": 1}, n=8)])

Errors: an env that raises or times out ends only its episode (``stop_reason="env_error"``, counted
in ``env/errors``); an env whose reset fails yields no trajectory for that sample (counted too).
Engine errors and `ChatTemplatePrefixError` propagate: they are bugs or misconfigurations.
"""
from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from orchestrator.envs.env_runner import EnvFailure, EnvRunnerLike
from orchestrator.rollout.multiturn import MultiTurnTrajectory, TrajectoryBuilder
from orchestrator.rollout.router import StickyRouter
from orchestrator.rollout.seeds import sample_seed, turn_seed


class AsyncEngine(Protocol):
    async def generate(self, prompt_ids: list, max_tokens: int, worker: Any) -> tuple:
        """Sample one turn: ([N] ids, [N] logprobs, finish_reason[, [N] weight versions]) with 1 <= N <= max_tokens.
        Called with a keyword `seed` (the turn's sampling seed, an int in [0, 2**63)) too when the group has a seed."""
        ...


@dataclass
class AgentLoopConfig:
    """max_turns: policy turns per trajectory (env.max_turns); max_tokens: prompt + response ids
    per trajectory (env.max_tokens); max_new_tokens: ids per turn (rollout.max_new_tokens);
    max_concurrency: trajectories in flight at once, 0 = all."""

    max_turns: int = 4
    max_tokens: int = 1024
    max_new_tokens: int = 256
    max_concurrency: int = 0

    def __post_init__(self):
        if self.max_turns < 1 or self.max_tokens < 2 or self.max_new_tokens < 1 or self.max_concurrency < 0:
            raise ValueError(f"agent loop: need env.max_turns >= 1, env.max_tokens >= 2, rollout.max_new_tokens >= 1, "
                             f"max_concurrency >= 0; got {self}")


@dataclass
class GroupRequest:
    """One dataset row to roll out `n` times; all n trajectories share `group_id` and a worker. `seed`: the
    group's sampling seed (orchestrator/rollout/seeds.py; turn t of sample i is sampled with
    turn_seed(sample_seed(seed, i), t)); None = the engine's own random state."""

    group_id: int
    sample: dict
    n: int = 1
    seed: Optional[int] = None


class AgentLoop:
    """Runs groups of multi-turn episodes concurrently (see the module docstring).

    Args:
        engine: an `AsyncEngine`.
        runner: the `EnvRunner` (threads) or `ActorEnvRunner` (env actors, env_pool.py) that makes and steps
            environments (`EnvRunnerLike`).
        renderer: a `ChatRenderer` (anything with ``start(messages) -> session`` whose session has
            ``prompt_ids``, ``action_text(ids)`` and ``observation_ids(context_ids, ids, messages)``).
        router: the `StickyRouter` over the engine's workers.
        cfg: `AgentLoopConfig`.
    """

    def __init__(self, engine: AsyncEngine, runner: EnvRunnerLike, renderer, router: StickyRouter, cfg: AgentLoopConfig):
        self.engine, self.runner, self.renderer, self.router, self.cfg = engine, runner, renderer, router, cfg

    def run_sync(self, groups: list) -> tuple[list, dict]:
        """`run` in a fresh event loop (for callers that are not async)."""
        return asyncio.run(self.run(groups))

    async def run(self, groups: list) -> tuple[list, dict]:
        """Roll out every group; returns (trajectories ordered by group then sample index, metrics).

        Metrics (floats): rollout/trajectories, rollout/turns_mean, rollout/turns_max,
        rollout/truncated_frac, rollout/reward_mean, rollout/response_tokens_mean,
        env/step_s_mean, env/errors, env/timeouts, env/reset_failures, env/stuck_threads,
        router/groups_per_worker_max; env/actor_restarts too when the runner has env actors.
        """
        stats = self.runner.stats
        before = (stats.errors, stats.timeouts, len(stats.step_seconds), getattr(stats, "actor_restarts", None))
        limit = asyncio.Semaphore(self.cfg.max_concurrency) if self.cfg.max_concurrency else None
        per_worker: dict = {}
        results = await asyncio.gather(*(self._group(g, limit, per_worker) for g in groups))
        trajectories = [t for group in results for t in group if t is not None]
        failed = sum(t is None for group in results for t in group)
        metrics = _metrics(trajectories, stats, before, failed)
        metrics["router/groups_per_worker_max"] = float(max(per_worker.values(), default=0))
        return trajectories, metrics

    async def _group(self, group: GroupRequest, limit, per_worker: dict) -> list:
        worker = self.router.assign(group.group_id)
        per_worker[worker] = per_worker.get(worker, 0) + 1
        try:
            return list(await asyncio.gather(*(self._limited(group, i, worker, limit) for i in range(group.n))))
        finally:
            self.router.release(group.group_id)

    async def _limited(self, group: GroupRequest, index: int, worker, limit):
        if limit is None:
            return await self._episode(group, index, worker)
        async with limit:
            return await self._episode(group, index, worker)

    async def _episode(self, group: GroupRequest, index: int, worker) -> MultiTurnTrajectory | None:
        try:
            env = await self.runner.make()
        except EnvFailure:
            return None  # counted by the runner; no prompt, so no trajectory
        try:
            return await self._play(env, group, index, worker)
        finally:
            self.runner.close(env)

    async def _play(self, env, group: GroupRequest, index: int, worker) -> MultiTurnTrajectory | None:
        try:
            messages = await self.runner.reset(env, dict(group.sample))
        except EnvFailure:
            return None  # counted by the runner; no prompt, so no trajectory
        session = self.renderer.start(messages)
        builder = TrajectoryBuilder(group.group_id, session.prompt_ids, self.cfg.max_tokens, index)
        for turn in range(self.cfg.max_turns):
            budget = min(self.cfg.max_new_tokens, builder.remaining())
            seeded = {} if group.seed is None else {"seed": turn_seed(sample_seed(group.seed, index), turn)}
            out = await self.engine.generate(builder.context_ids, budget, worker, **seeded)
            ids, logprobs, versions = out[0], out[1], out[3:]  # versions: streamed episodes report them
            builder.add_sampled(list(ids), list(logprobs), list(versions[0]) if versions else None)
            try:
                step = await self.runner.step(env, session.action_text(list(ids)))
            except EnvFailure as e:
                return builder.finish("env_error", env_error=str(e))
            builder.add_reward(step.reward, step.info)
            if step.done:
                return builder.finish("done")
            if builder.remaining() <= 0:
                return builder.finish("max_tokens")
            if turn == self.cfg.max_turns - 1:
                break
            observation = session.observation_ids(builder.context_ids, list(ids), step.observation)
            if not builder.add_observation(observation) or builder.remaining() <= 0:
                return builder.finish("max_tokens")
        return builder.finish("max_turns")


def _metrics(trajectories: list, stats, before: tuple, reset_failures: int) -> dict:
    turns = [t.num_turns for t in trajectories]
    step_s = stats.step_seconds[before[2]:]
    n = max(len(trajectories), 1)
    metrics = {
        "rollout/trajectories": float(len(trajectories)),
        "rollout/turns_mean": float(statistics.fmean(turns)) if turns else 0.0,
        "rollout/turns_max": float(max(turns, default=0)),
        "rollout/truncated_frac": sum(t.truncated for t in trajectories) / n,
        "rollout/reward_mean": sum(t.reward for t in trajectories) / n,
        "rollout/response_tokens_mean": sum(len(t.response_ids) for t in trajectories) / n,
        "env/step_s_mean": float(statistics.fmean(step_s)) if step_s else 0.0,
        "env/errors": float(stats.errors - before[0] + stats.timeouts - before[1]),
        "env/timeouts": float(stats.timeouts - before[1]),
        "env/reset_failures": float(reset_failures),
        "env/stuck_threads": float(stats.stuck_threads),
    }
    if before[3] is not None:  # env actors (env.placement=actor): replaced after a hang or crash
        metrics["env/actor_restarts"] = float(stats.actor_restarts - before[3])
    return metrics
