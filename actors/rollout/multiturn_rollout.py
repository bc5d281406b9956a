"""Multi-turn rollouts on one rollout worker: the agent loop over this worker's vLLM engine and envs.

`MultiTurnRollout` is what `RolloutWorker.generate_multiturn` runs. It holds, per worker process:
the turns' engine driver (`StreamTurns` over the worker's `StreamingGenerator`, actors/rollout/stream_episodes.py and
stream.py: the one driver of every multi-turn rollout, batched or streamed), an `EnvRunner` whose environment
calls run in threads next to the engine (so a slow environment never blocks sampling) or, with
env.placement=actor, an `ActorEnvRunner` over this worker's env actors (actors/env_actor.py), and a
`ChatRenderer` over the model's tokenizer. For every call it runs an `AgentLoop`
(orchestrator/rollout/agent_loop.py) over the groups the controller routed to this worker: all
samples and turns of those groups run here, on this engine, so vLLM's prefix cache serves each
group's shared prompt and each trajectory's growing history.

    rollout = MultiTurnRollout(engine, StreamTurns(stream), tokenizer)
    trajectories, metrics = rollout.run(groups, env_cfg, max_new_tokens=32, weight_version=3, worker_id=0)

The trajectories are `Trajectory` objects (`MultiTurnTrajectory.to_trajectory`): response_ids hold
the sampled and observation ids, `multiturn.loss_mask` marks the sampled ones (1) and
`multiturn.turn_rewards` the environment's rewards; the reward of a trajectory is their sum.
"""
from __future__ import annotations

import time
from typing import Any

from actors.env_actor import make_env_runner
from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.rollout.chat_render import ChatRenderer, check_template_keeps_history
from orchestrator.envs.env import resolve_env_factory, with_tool_format
from orchestrator.envs.env_runner import EnvRunner
from orchestrator.rollout.router import StickyRouter
from orchestrator.rollout.types import Trajectory

_ENV_KEYS = ("name", "kwargs", "num_workers", "step_timeout_s", "render_mode", "tool_format", "placement", "num_actors",
             "actor_cpus")


def as_group_request(group: Any) -> GroupRequest:
    """A `GroupRequest` from itself or a dict {"group_id": int, "sample": dict, "n": int[, "seed": int | None]}.

    Raises ValueError naming the missing key.
    """
    if isinstance(group, GroupRequest):
        return group
    missing = [k for k in ("group_id", "sample", "n") if k not in group]
    if missing:
        raise ValueError(f"multi-turn group request {group!r:.80} lacks {missing}")
    seed = group.get("seed")
    return GroupRequest(int(group["group_id"]), dict(group["sample"]), int(group["n"]), None if seed is None else int(seed))


class MultiTurnRollout:
    """Runs agent loops on one engine (see the module docstring).

    Args:
        engine: a `VLLMEngine` (in this process; its prefix-cache counters are read).
        turns: the turns' `AsyncEngine` on that engine (`StreamTurns` over the worker's `StreamingGenerator`).
        tokenizer: the policy's transformers tokenizer (with a chat template).
        end_ids: the ids that end an assistant turn (orchestrator/rollout/chat_render.py end_of_turn_ids).
        env_actors: `.options(...)` of this worker's env actors (env.placement=actor), see actors/env_actor.py.
    """

    def __init__(self, engine, turns, tokenizer, env_actors: list | None = None, end_ids: list | None = None):
        self.engine, self.turns, self.tokenizer, self.env_actors = engine, turns, tokenizer, list(env_actors or [])
        self.end_ids = end_ids  # the ids that end a turn (chat_render.end_of_turn_ids); None = the tokenizer's eos
        self._env_key: tuple | None = None
        self.runner: EnvRunner | None = None  # or an ActorEnvRunner (env.placement=actor)
        self.renderer: ChatRenderer | None = None

    def configure(self, env_cfg: dict) -> None:
        """(Re)build the env runner and renderer when the env settings change; keeps runner stats otherwise."""
        key = tuple(repr(env_cfg.get(k)) for k in _ENV_KEYS)
        if key == self._env_key:
            return
        if hasattr(self.runner, "shutdown"):  # the env actors of the previous settings
            self.runner.shutdown()
        self.renderer = ChatRenderer(self.tokenizer, env_cfg.get("render_mode", "strict"), end_of_turn_ids=self.end_ids,
                                     tool_format=env_cfg.get("tool_format", "auto"))
        kwargs = with_tool_format(resolve_env_factory(env_cfg["name"]), dict(env_cfg.get("kwargs") or {}),
                                  self.renderer.tool_format.name)
        self.runner = make_env_runner({**env_cfg, "kwargs": kwargs}, self.env_actors)
        if self.renderer.mode == "strict":
            check_template_keeps_history(self.renderer)  # a history-rewriting template fails before any rollout
        self._env_key = key

    def run(self, groups: list, env_cfg: dict, max_new_tokens: int, weight_version: int,
            worker_id: Any = 0) -> tuple[list[Trajectory], dict[str, float]]:
        """Roll out `groups` (GroupRequest or dicts); returns (trajectories, metrics).

        env_cfg: the `env` config section as a dict (name, kwargs, num_workers, step_timeout_s, max_turns,
        max_tokens, render_mode, tool_format: "auto" is resolved from the tokenizer's chat template and passed to
        environments whose constructor takes `tool_format`). Metrics: the agent loop's (rollout/turns_mean, rollout/truncated_frac,
        env/step_s_mean, env/errors, ...) plus rollout/tokens (sampled), rollout/generate_s,
        rollout/tokens_per_s, rollout/prefill_tokens_requested / _computed, rollout/prefix_cache_hits
        (vLLM's counters over this call), rollout/engine_steps and rollout/in_flight_max.
        """
        self.configure(env_cfg)
        requests = [as_group_request(g) for g in groups]
        loop_cfg = AgentLoopConfig(max_turns=int(env_cfg["max_turns"]), max_tokens=int(env_cfg["max_tokens"]),
                                   max_new_tokens=int(max_new_tokens))
        loop = AgentLoop(self.turns, self.runner, self.renderer, StickyRouter([worker_id]), loop_cfg)
        before, steps0 = self.engine.cache_counters(), self.turns.stream.steps
        self.turns.max_in_flight = 0
        t0 = time.perf_counter()
        episodes, metrics = loop.run_sync(requests)
        dt = time.perf_counter() - t0
        after = self.engine.cache_counters()
        trajectories = []
        for ep in episodes:
            t = ep.to_trajectory(weight_version)
            t.multiturn.rollout_worker = worker_id
            t.text = self.tokenizer.decode(ep.trained_ids(), skip_special_tokens=True)
            trajectories.append(t)
        sampled = sum(sum(t.multiturn.loss_mask) for t in trajectories)
        requested = after["prefix_cache_queries"] - before["prefix_cache_queries"]
        hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
        metrics.update({"rollout/tokens": float(sampled), "rollout/generate_s": dt,
                        "rollout/tokens_per_s": sampled / max(dt, 1e-9),
                        "rollout/prefill_tokens_requested": requested, "rollout/prefill_tokens_computed": requested - hits,
                        "rollout/prefix_cache_hits": hits, "rollout/engine_steps": float(self.turns.stream.steps - steps0),
                        "rollout/in_flight_max": float(self.turns.max_in_flight)})
        return trajectories, metrics
