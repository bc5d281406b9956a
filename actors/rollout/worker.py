"""RolloutWorker: one vLLM engine per replica; groups in, trajectories out; takes weight syncs.

`RolloutWorker` is the plain class (testable without Ray); `RolloutWorkerActor` is its Ray actor.
"""
from __future__ import annotations

import time

import ray

from actors.rollout.vllm_engine import VLLMEngine
from orchestrator.rollout.types import PromptRequest, Trajectory


class RolloutWorker:
    """Owns one engine and the weight version it holds."""

    def __init__(self, model_path: str, rollout_cfg, seed: int = 0):
        self.engine = VLLMEngine(model_path, rollout_cfg, seed=seed)
        self.n = rollout_cfg.n
        self.version = 0

    def generate(self, requests: list[PromptRequest]) -> tuple[list[Trajectory], dict[str, float]]:
        """Sample a group of `rollout.n` per request. Returns trajectories and `rollout/*` metrics."""
        t0 = time.perf_counter()
        trajs = self.engine.generate(requests, self.n, self.version)
        dt = time.perf_counter() - t0
        tokens = sum(len(t.response_ids) for t in trajs)
        return trajs, {"rollout/tokens": tokens, "rollout/generate_s": dt, "rollout/tokens_per_s": tokens / max(dt, 1e-9)}

    def checksums(self) -> dict:
        """The engine's weight version and tensor-group checksums."""
        return self.engine.weight_checksums()

    def load_weights(self, named_tensors: list, version: int) -> dict:
        """Load a new weight version; returns the engine's checksums ({"version", "groups", ...})."""
        checks = self.engine.load_weights(named_tensors, version)
        self.version = version
        return checks


@ray.remote
class RolloutWorkerActor(RolloutWorker):
    """Ray actor over `RolloutWorker`."""

    def ready(self) -> bool:
        return True
