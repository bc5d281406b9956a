"""Streamed multi-turn episodes in a rollout worker (`rollout.partial_rollout=true` with `env.name` set): the agent
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
Failures: an env error or timeout ends its episode, as in every multi-turn rollout; an episode whose make/reset
failed leaves its group short, which no buffer can complete, so the group's failure (and any engine or template
error) is raised by the next `drain` (RuntimeError naming env.name).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any, Optional

from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig
from orchestrator.rollout.multi_turn_source import group_request
from orchestrator.rollout.partial import PartialSample
from orchestrator.rollout.partial_episode import EpisodeSample
from orchestrator.rollout.router import StickyRouter
from orchestrator.rollout.types import PromptRequest

_TURN_IDS = itertools.count()  # a turn sample's group id in the engine's bookkeeping (its key must be unique)


class StreamTurns:
    """`AsyncEngine` over a `StreamingGenerator`: one turn = one partial sample on the engine thread.

    Attributes: prompt_tokens, turns: prompt ids and turns submitted (for metrics)."""

    def __init__(self, stream):
        self.stream = stream
        self.turns = self.prompt_tokens = 0

    async def generate(self, prompt_ids: list, max_tokens: int, worker: Any = None,
                       seed: Optional[int] = None) -> tuple[list, list, str, list]:
        """Sample one turn after `prompt_ids` ([P] ints): ([N] ids, [N] behaviour logprobs (float, nats), "stop" |
        "length", [N] weight versions, non-decreasing), 1 <= N <= max_tokens. `worker` is ignored (one engine);
        `seed`: the turn's vLLM seed (a continued segment's is derived with seeds.resume_seed).
        Raises ValueError for an empty prompt or max_tokens < 1."""
        if not prompt_ids or max_tokens < 1:
            raise ValueError(f"generate: need a non-empty prompt and max_tokens >= 1, got {len(prompt_ids)} "
                             f"prompt ids and max_tokens={max_tokens}")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        request = PromptRequest(-1 - next(_TURN_IDS), [int(t) for t in prompt_ids], "")
        sample = PartialSample(request, 0, int(max_tokens), first_seed=seed)

        def done(s: PartialSample) -> None:  # on the engine thread
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(s))

        self.stream.submit_turn(sample, done)
        self.turns += 1
        self.prompt_tokens += len(prompt_ids)
        s = await future
        return list(s.response_ids), list(s.logprobs), s.finish_reason, list(s.token_versions)


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
        try:
            loop = AgentLoop(self.engine, self.multiturn.runner, self.multiturn.renderer,
                             StickyRouter([self.worker_id]), cfg)
            episodes, _ = await loop.run([group_request(request, self.n)])
            if len(episodes) < self.n:
                raise RuntimeError(f"streamed group {request.group_id}: {self.n - len(episodes)} of its {self.n} "
                                   f"episodes failed to start (make/reset of env.name={name!r} failed; see "
                                   "env/reset_failures): a streamed group must be whole")
            decode = self.multiturn.tokenizer.decode
            self.stream.put_done([EpisodeSample(request, ep, decode(ep.trained_ids(), skip_special_tokens=True),
                                                self.worker_id) for ep in episodes])
        except BaseException as e:  # noqa: BLE001 - handed to the controller by the next drain
            self.stream.fail(e)

    def close(self) -> None:
        """Stop the episode loop (episodes still running are cancelled)."""
        for future in list(self.running):
            future.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
