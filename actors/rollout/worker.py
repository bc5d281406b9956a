"""RolloutWorker: one vLLM engine per replica; groups in, trajectories out; takes weight syncs.

The engine has one driver, a `StreamingGenerator` (actors/rollout/stream.py) whose thread builds the engine and runs
every call that runs its model: `generate` (a batch generated to the end), the `stream_*` calls (rollout.mode=stream) and
multi-turn turns (`generate_multiturn`, streamed episodes) are its requests; weight loads, checksums, probes and
sleep/wake run on its thread between two steps (`StreamingGenerator.call`: the requests in flight are aborted, their
tokens kept, and continue after it).

`RolloutWorker` is the plain class (testable without Ray); `RolloutWorkerActor` is its Ray actor.
"""
from __future__ import annotations

import time
from typing import Optional

import ray

from actors.memory_metrics import peak_memory_metrics
from actors.pinning import pin_from_env
from actors.rollout.sleep_state import SleepState
from actors.rollout.vllm_engine import VLLMEngine
from orchestrator.rollout.types import PromptRequest, Trajectory


def make_engine(model_path: str, rollout_cfg, seed: int = 0, sleep_mode: bool = False,
                exit_with_core: bool = False) -> VLLMEngine:
    """The engine of `rollout.engine`: "in_process" a `VLLMEngine` (vLLM's `LLM`, its core in this process),
    "async_llm" an `AsyncLLMEngine` (vLLM's `AsyncLLM`, its core in a process of its own;
    actors/rollout/async_llm_engine.py; `exit_with_core`: this process ends when that core dies)."""
    if getattr(rollout_cfg, "engine", "in_process") == "async_llm":
        from actors.rollout.async_llm_engine import AsyncLLMEngine

        return AsyncLLMEngine(model_path, rollout_cfg, seed, sleep_mode, exit_with_core)
    return VLLMEngine(model_path, rollout_cfg, seed, sleep_mode)


class RolloutWorker:
    """Owns one engine and the weight version it holds."""

    EXIT_WITH_ENGINE = False  # an engine in a process of its own (async_llm) that dies: raise (here) or end (the actor)

    def __init__(self, model_path: str, rollout_cfg, seed: int = 0, colocated: bool = False,
                 env_actors: Optional[list] = None):
        """env_actors: `.options(...)` of this worker's env actors in the job's placement group
        (env.placement=actor; orchestrator/placement/groups.py `env_actor_options`); None or [] = Ray places them."""
        from actors.rollout.stream import StreamingGenerator

        pin_from_env()  # fake GPUs: this engine's cores (actors/pinning.py), before vLLM starts threads
        self.model_path = model_path
        self.n = rollout_cfg.n
        self.max_new_tokens = rollout_cfg.max_new_tokens
        self.version = 0
        # the engine's driver; its thread builds the engine (raises the build's error here)
        self.stream = StreamingGenerator(None, self.n, self.max_new_tokens, lambda: self.version,
                                         build=lambda: make_engine(model_path, rollout_cfg, seed, colocated,
                                                                   self.EXIT_WITH_ENGINE))
        self.engine = self.stream.engine  # its tokenizer, config and counters; calls into it go through the driver
        self.sleep_state = SleepState(_OnDriver(self.stream))  # colocated time-slicing: sleep / wake_up, recorded
        self._multiturn = None  # MultiTurnRollout, made on the first multi-turn call
        self.env_actors = list(env_actors or [])
        self.episodes = None  # StreamingEpisodes (rollout.mode=stream with env.name), made on the first multi-turn submit

    # ---- streaming generation with partial rollouts (actors/rollout/stream.py) -------------------
    def stream_submit(self, requests: list[PromptRequest], env_cfg: Optional[dict] = None, worker_id: int = 0) -> int:
        """Queue the requests' groups on the engine's stream. Returns samples queued.
        env_cfg (the `env` section as a dict, multi-turn tasks): each group is n episodes whose turns stream
        (actors/rollout/stream_episodes.py); worker_id is recorded on their trajectories."""
        if not env_cfg:
            return self.stream.submit(requests)
        if self.episodes is None:
            from actors.rollout.stream_episodes import StreamingEpisodes

            self.episodes = StreamingEpisodes(self.stream, self._multiturn_rollout(), self.n, self.max_new_tokens,
                                              worker_id)
        return self.episodes.submit(requests, env_cfg)

    def stream_drain(self, wait_s: float = 0.0) -> tuple[list, dict]:
        """Finished PartialSamples (multi-turn: EpisodeSamples, FailedEpisodes) since the last drain (waiting up to
        `wait_s` s for one) and `stream/*` metrics (multi-turn with env actors: + env/actor_restarts since the last
        drain)."""
        samples, metrics = self.stream.drain(wait_s)
        if self.episodes is not None:
            metrics.update(self.episodes.metrics())
        return samples, metrics

    def stream_snapshot(self) -> tuple[list, list]:
        """For a checkpoint (single-turn streams): (the finished PartialSamples not drained yet, handed over as
        `stream_drain` does; copies of the unfinished ones, in the engine or queued, tokens so far kept). Taken
        between two engine steps; generation goes on (actors/rollout/stream.py `snapshot`)."""
        return self.stream.snapshot()

    def stream_resume(self, samples: list) -> int:
        """Queue a checkpoint's PartialSamples (fresh, or continuations that keep their tokens and continue on
        this engine's weights as after a weight sync). Returns how many."""
        return self.stream.resume(samples)

    def stream_hold(self) -> int:
        """Hold the engine's stream idle across calls (an overlapped weight sync: from before its load until the
        controller verified it; actors/rollout/stream.py `hold`; `generate`'s samples still run). Returns the requests
        interrupted."""
        return self.stream.hold()

    def stream_prioritize(self, group_ids: list[int]) -> None:
        """The groups the trainer waits for: their samples enter the engine before any other's while one of them
        is unfinished (actors/rollout/stream.py `prioritize`); empty: no priority."""
        self.stream.prioritize(group_ids)

    def stream_release(self) -> None:
        """End `stream_hold`: the held requests continue on this engine's weight version."""
        self.stream.release()

    def generate(self, requests: list[PromptRequest]) -> tuple[list[Trajectory], dict[str, float]]:
        """Sample a group of `rollout.n` per request (its sampling override's n, temperature and max_new_tokens
        where set), all queued at once on the engine's one driver and generated to the end (actors/rollout/stream.py
        `generate`; held-out eval during a streaming run joins the stream's batch). Returns trajectories (request
        order, then sample index) and `rollout/*` metrics (the prefill counters are the engine's over the call, the
        stream's requests included when one runs beside)."""
        self.sleep_state.ensure_awake("generate")
        before = self.engine.cache_counters()
        t0 = time.perf_counter()
        trajs = [s.to_trajectory() for s in self.stream.generate(requests)]
        dt = time.perf_counter() - t0
        after = self.engine.cache_counters()
        tokens = sum(len(t.response_ids) for t in trajs)
        requested = after["prefix_cache_queries"] - before["prefix_cache_queries"]
        hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
        return trajs, {"rollout/tokens": tokens, "rollout/generate_s": dt, "rollout/tokens_per_s": tokens / max(dt, 1e-9),
                       "rollout/prefill_tokens_requested": requested, "rollout/prefill_tokens_computed": requested - hits,
                       "rollout/prefix_cache_hits": hits, **peak_memory_metrics("rollout")}

    def generate_multiturn(self, groups: list, env_cfg: dict, worker_id=0) -> tuple[list[Trajectory], dict[str, float]]:
        """Multi-turn episodes for the groups routed to this worker (GroupRequest or {"group_id", "sample",
        "n"} dicts), every turn on this engine with continuous batching; envs run in threads here
        (env.placement=thread) or in this worker's env actors (actor).
        env_cfg: the `env` config section as a dict. Returns trajectories (loss mask and turn rewards in
        `extra`, see actors/rollout/multiturn_rollout.py) and `rollout/*`, `env/*` metrics."""
        self.sleep_state.ensure_awake("generate_multiturn")
        return self._multiturn_rollout().run(groups, env_cfg, self.max_new_tokens, self.version, worker_id)

    def _multiturn_rollout(self):
        """This worker's `MultiTurnRollout` (tokenizer, chat renderer, env runner), made on first use."""
        if self._multiturn is None:
            from transformers import AutoTokenizer

            from actors.rollout.multiturn_rollout import MultiTurnRollout
            from actors.rollout.stream_episodes import StreamTurns
            from orchestrator.rollout.chat_render import end_of_turn_ids

            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self._multiturn = MultiTurnRollout(self.engine, StreamTurns(self.stream), tokenizer,
                                               env_actors=self.env_actors,
                                               end_ids=end_of_turn_ids(tokenizer, self.model_path))
        return self._multiturn

    def checksums(self) -> dict:
        """The engine's weight version and tensor-group checksums."""
        return self.stream.call(lambda engine: engine.weight_checksums())

    # ---- weight sync (orchestrator/weight_sync/syncer.py drives it) -------------------------------
    def weight_sync(self, strategy, method: str, *args) -> Optional[dict]:
        """The engine's side of a weight sync, over vLLM's weight-transfer protocol (actors/weight_sync/
        transfer_engine.py; `strategy`: a registry entry or a registered name). "connect" (info, engine_index):
        `init_weight_transfer_engine` (the strategy's receiver connects), returns None; "load" (payload, version):
        start, update, finish, then returns the engine's checksums {"version", "groups", ...} (prefix cache dropped).
        Raises ValueError for another method."""
        if method == "connect":
            return self.stream.call(lambda engine: engine.connect_weights(strategy, *args))
        if method != "load":
            raise ValueError(f"RolloutWorker.weight_sync: method {method!r}; use 'connect' or 'load'")
        self.sleep_state.ensure_weights_awake(f"weight_sync:{getattr(strategy, 'name', strategy)}")

        def load(engine) -> dict:  # on the driver: in-flight requests continue on the new version after it
            checks = engine.update_weights(strategy, *args)
            self.version = checks["version"]
            return checks

        return self.stream.call(load)

    def probe_tokens(self) -> tuple[list[int], list[int]]:
        """(prompt ids, continuation ids) of the weight-sync probe text in this engine's tokenizer."""
        from orchestrator.weight_sync.probe import probe_tokens

        return probe_tokens(lambda text: self.engine.tokenizer.encode(text, add_special_tokens=False))

    def probe_logprobs(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 0):
        """The engine's `ProbeScores` of the continuation after the prompt, temperature 1: its logprobs
        [len(continuation_ids)] and, with `top_k` > 0, each position's top_k tokens (the weight-sync probe; the
        trainer's side is `Trainer.probe_logprobs`)."""
        self.sleep_state.ensure_awake("probe")
        ids = list(prompt_ids) + list(continuation_ids)
        return self.stream.call(lambda engine: engine.prompt_scores(ids, len(prompt_ids), top_k))

    def extension_call(self, method: str, *args):
        """Other worker-extension methods: record_digests, loaded_digests, inject_fault_next_load,
        inject_hang_next_load, corrupt_resident_weights, inject_fault_after_next_load."""
        return self.stream.call(lambda engine: engine.extension_call(method, *args))

    # ---- colocated time-slicing (orchestrator/placement/modes.py) -------------------------------
    def sleep_engine(self, level: int = 1) -> None:
        """vLLM sleep (level 1: weights to host memory, KV cache dropped) while the trainer trains."""
        self.sleep_state.sleep(level)

    def wake_engine(self, tags: Optional[list] = None) -> None:
        """vLLM wake_up: tags ["weights"] before a weight sync; the KV cache wakes before the next generate."""
        self.sleep_state.wake_up(tags)

    def cpu_affinity(self) -> list[int]:
        """The cores this engine's process may run on (fake GPUs pin it, actors/pinning.py)."""
        import os

        return sorted(os.sched_getaffinity(0))

    def sleep_events(self) -> list:
        """The sleep/wake calls so far, in order: ("sleep", level), ("wake_up", tags), ("generate", None) ..."""
        return list(self.sleep_state.events)


class _OnDriver:
    """The engine's sleep / wake_up (SleepState's engine), run on the driver's thread."""

    def __init__(self, stream):
        self.stream = stream

    def sleep(self, level: int = 1) -> None:
        self.stream.call(lambda engine: engine.sleep(level))

    def wake_up(self, tags: Optional[list] = None) -> None:
        self.stream.call(lambda engine: engine.wake_up(tags))


@ray.remote
class RolloutWorkerActor(RolloutWorker):
    """Ray actor over `RolloutWorker`."""

    EXIT_WITH_ENGINE = True  # its engine core died: the actor's process ends, and the job replaces it (docs/faults.md)

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        """This actor's process id (fault tests kill it)."""
        import os

        return os.getpid()
