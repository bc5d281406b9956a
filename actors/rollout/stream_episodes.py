"""Streamed multi-turn episodes in a rollout worker (`rollout.mode=stream` with `env.name` set): the agent
loop of every submitted group runs continuously on an asyncio event loop of its own thread, and each policy turn is
one request on the worker's streaming engine (actors/rollout/stream.py), the same engine thread that streams
single-turn groups. Environment calls run in the env runner's threads (or env actors), never on the engine thread,
so a slow environment step never blocks generation; a weight update interrupts the turns in flight, which continue
on the new weights with their tokens kept (each sampled id stamped with its version and behaviour logprob).

    episodes = StreamingEpisodes(stream, multiturn, n=4, max_new_tokens=32, worker_id=0)
    episodes.submit(requests, env_cfg)   # PromptRequests: one group of n episodes each, started at once
    samples, metrics = stream.drain(0.5) # finished groups' EpisodeSamples (orchestrator/rollout/partial_episode.py)

A group's episodes enter the stream's output together when the last one ends (the controller's group buffer takes
whole groups). The episode loop is `AgentLoop` (orchestrator/rollout/agent_loop.py) over `StreamTurns`, the
`AsyncEngine` whose `generate` queues the turn as a `PartialSample` (`StreamingGenerator.submit_turn`) and awaits it.
Failures, as in every multi-turn rollout (orchestrator/rollout/agent_loop.py): an env error or timeout ends its
episode, which is trained with the turns it has; an episode whose make/reset failed has no trajectory and comes back
as a `FailedEpisode` (orchestrator/rollout/partial_episode.py) that completes its group's slot and is never trained.
Each group's env calls are counted on the way (`GroupEnvTally`: failed episodes by kind, reset failures, seconds
inside env.step), and every sample of the group carries the tally, so the controller counts each batch's env/*
and applies env.max_failed_frac to it (orchestrator/rollout/stream_source.py). An engine or chat-template error is
raised by the next `drain`. `metrics()`: env/actor_restarts since its last call (env.placement=actor).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any, Optional

from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig
from orchestrator.envs.env_runner import EnvFailure
from orchestrator.rollout.multi_turn_source import group_request
from orchestrator.rollout.partial import PartialSample
from orchestrator.rollout.partial_episode import EpisodeSample, FailedEpisode, GroupEnvTally
from orchestrator.rollout.router import StickyRouter
from orchestrator.rollout.types import PromptRequest

_TURN_IDS = itertools.count()  # a turn sample's group id in the engine's bookkeeping (its key must be unique)
# turns' group ids: below every other request's (training groups are >= 0, held-out eval prompts -1, -2, ...: the
# eval's generate and streamed turns share the engine)
_TURN_GROUP_BASE = -(1 << 40)


class StreamTurns:
    """`AsyncEngine` over a `StreamingGenerator`: one turn = one partial sample on the engine thread. The one engine
    driver of multi-turn rollouts: batched episodes (actors/rollout/multiturn_rollout.py) and streamed ones
    (`StreamingEpisodes`) both run their turns through it.

    Attributes: prompt_tokens, turns: prompt ids and turns submitted; in_flight: turns submitted and not finished;
    max_in_flight: the most at one time (reset by the caller; for metrics and tests of "many turns at once")."""

    def __init__(self, stream):
        self.stream = stream
        self.turns = self.prompt_tokens = self.in_flight = self.max_in_flight = 0

    async def generate(self, prompt_ids: list, max_tokens: int, worker: Any = None,
                       seed: Optional[int] = None) -> tuple[list, list, str, list]:
        """Sample one turn after `prompt_ids` ([P] ints): ([N] ids, [N] behaviour logprobs (float, nats), "stop" |
        "length", [N] weight versions, non-decreasing), 1 <= N <= max_tokens. `worker` is ignored (one engine);
        `seed`: the turn's vLLM seed (a continued segment's is derived with seeds.resume_seed).
        Raises ValueError for an empty prompt or max_tokens < 1; the engine's error if it fails before the turn
        finished (RuntimeError if the stream is closed meanwhile)."""
        if not prompt_ids or max_tokens < 1:
            raise ValueError(f"generate: need a non-empty prompt and max_tokens >= 1, got {len(prompt_ids)} "
                             f"prompt ids and max_tokens={max_tokens}")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        request = PromptRequest(_TURN_GROUP_BASE - next(_TURN_IDS), [int(t) for t in prompt_ids], "")
        sample = PartialSample(request, 0, int(max_tokens), first_seed=seed)

        def done(s: PartialSample) -> None:  # on the engine thread
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(s))

        def failed(e: BaseException) -> None:  # the engine failed (or the stream closed): the turn raises it
            loop.call_soon_threadsafe(lambda: future.done() or future.set_exception(e))

        self.stream.submit_turn(sample, done, failed)
        self.turns += 1
        self.prompt_tokens += len(prompt_ids)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            s = await future
        finally:
            self.in_flight -= 1
        return list(s.response_ids), list(s.logprobs), s.finish_reason, list(s.token_versions)


class TalliedEnvs:
    """The env runner (`EnvRunnerLike`) seen by one group's episodes: every call goes to `runner`, and what the
    group's calls did is counted in `tally` (a `GroupEnvTally`). `stats` is the runner's (the agent loop reads it)."""

    def __init__(self, runner, tally: GroupEnvTally):
        self.runner, self.tally, self.stats = runner, tally, runner.stats

    async def make(self):
        return await self._counted(self.runner.make())

    async def reset(self, env, sample: dict):
        return await self._counted(self.runner.reset(env, sample))

    async def step(self, env, action: str):
        result = await self._counted(self.runner.step(env, action))
        # the runner appended this step's seconds just before returning, with no await in between: it is the last
        self.tally.step_s += float(self.runner.stats.step_seconds[-1])
        self.tally.steps += 1
        return result

    def close(self, env) -> None:
        self.runner.close(env)

    async def _counted(self, call):
        try:
            return await call
        except EnvFailure as e:
            self.tally.failed(e)
            raise


class StreamingEpisodes:
    """Runs streamed episode groups on one worker (see the module docstring).

    Args:
        stream: the worker's `StreamingGenerator`.
        multiturn: the worker's `MultiTurnRollout` (its env runner, chat renderer and tokenizer are used).
        n: episodes per group (rollout.n); max_new_tokens: ids per turn (rollout.max_new_tokens);
        worker_id: recorded on every trajectory (`multiturn.rollout_worker`).
    """

    def __init__(self, stream, multiturn, n: int, max_new_tokens: int, worker_id: int = 0):
        self.stream, self.multiturn, self.n = stream, multiturn, n
        self.max_new_tokens, self.worker_id = max_new_tokens, worker_id
        self.engine = StreamTurns(stream)
        self.loop = asyncio.new_event_loop()
        self.running: set = set()  # the groups' futures (concurrent.futures), until they end
        self._restarts: tuple = (None, 0)  # (the runner's stats, its actor_restarts) at the last `metrics`
        self.thread = threading.Thread(target=self.loop.run_forever, name="rollout-episodes", daemon=True)
        self.thread.start()

    def submit(self, requests: list[PromptRequest], env_cfg: dict) -> int:
        """Start every request's group of n episodes (env_cfg: the `env` section as a dict, as for
        `MultiTurnRollout.run`). Returns the episodes started."""
        self.multiturn.configure(env_cfg)
        cfg = AgentLoopConfig(max_turns=int(env_cfg["max_turns"]), max_tokens=int(env_cfg["max_tokens"]),
                              max_new_tokens=int(self.max_new_tokens))
        name = env_cfg.get("name")
        for r in requests:
            future = asyncio.run_coroutine_threadsafe(self._group(r, cfg, name), self.loop)
            self.running.add(future)
            future.add_done_callback(self.running.discard)
        return len(requests) * self.n

    async def _group(self, request: PromptRequest, cfg: AgentLoopConfig, name: str) -> None:
        """Run the group's n episodes; hand them to the stream together (a failed start as a `FailedEpisode`)."""
        try:
            n = self._size(request)
            tally = GroupEnvTally(episodes=n)
            loop = AgentLoop(self.engine, TalliedEnvs(self.multiturn.runner, tally), self.multiturn.renderer,
                             StickyRouter([self.worker_id]), cfg)
            episodes, _ = await loop.run([group_request(request, n)])
            decode = self.multiturn.tokenizer.decode
            done = [EpisodeSample(request, ep, decode(ep.trained_ids(), skip_special_tokens=True), self.worker_id,
                                  tally) for ep in episodes]
            started = {ep.sample_index for ep in episodes}
            tally.reset_failures = n - len(started)
            failed = [FailedEpisode(request, i, f"make/reset of env.name={name!r} failed", tally)
                      for i in range(n) if i not in started]
            self.stream.put_done(done + failed)
        except BaseException as e:  # noqa: BLE001 - handed to the controller by the next drain
            self.stream.fail(e)

    def _size(self, request: PromptRequest) -> int:
        return request.sampling.n if request.sampling is not None else self.n

    def metrics(self) -> dict[str, float]:
        """env/actor_restarts: env actors replaced since the last call (env.placement=actor; else {})."""
        stats = getattr(self.multiturn.runner, "stats", None)
        restarts = getattr(stats, "actor_restarts", None)
        if restarts is None:
            return {}
        seen_stats, seen = self._restarts
        self._restarts = (stats, restarts)
        return {"env/actor_restarts": float(restarts - seen if stats is seen_stats else restarts)}

    def close(self) -> None:
        """Stop the episode loop (episodes still running are cancelled)."""
        for future in list(self.running):
            future.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
