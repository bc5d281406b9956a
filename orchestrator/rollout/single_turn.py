"""Single-turn rollouts: one prompt, `rollout.n` sampled responses per group, on the rollout workers.

Whole groups per worker: request i goes to worker i mod R with all its n samples (RolloutWorker.generate).
Metrics (into the step's row): rollout/tokens, rollout/tokens_per_s, rollout/prefill_tokens_requested /
_computed, rollout/prefix_cache_hit_rate (vLLM's, over the step's prompt tokens: a group's n samples share
one prompt), rollout/worker<k>_tokens_per_s, rollout/worker_generate_s_mean, rollout/response_len_mean,
rollout/truncated_frac, and the largest engine's memory/* peaks.
"""
from __future__ import annotations

from typing import Any

from orchestrator.runtime.faults import call_engine
from orchestrator.rollout.source import Launched, RolloutSource
from orchestrator.rollout.types import PromptRequest, Trajectory


class SingleTurnSource(RolloutSource):
    """One generate call per worker with its share of the groups (see the module docstring)."""

    def _shards(self, requests: list[PromptRequest]) -> list[tuple[int, Any]]:
        shards = [requests[i :: len(self.workers)] for i in range(len(self.workers))]
        return [(k, s) for k, s in enumerate(shards) if s]

    def _call(self, worker: int, payload: list[PromptRequest]) -> Any:
        return call_engine(self.workers, worker, self.window, "generate", payload)

    def _metrics(self, launched: Launched, trajs: list[Trajectory]) -> dict:
        results = launched.results
        row: dict = {"rollout/tokens": sum(m["rollout/tokens"] for _, m in results),
                     "rollout/tokens_per_s": sum(m["rollout/tokens_per_s"] for _, m in results)}
        for k in ("rollout/prefill_tokens_requested", "rollout/prefill_tokens_computed"):
            row[k] = sum(m[k] for _, m in results)
        requested = row["rollout/prefill_tokens_requested"]
        hits = sum(m["rollout/prefix_cache_hits"] for _, m in results)
        row["rollout/prefix_cache_hit_rate"] = hits / requested if requested else 0.0
        for k, (_, m) in enumerate(results):  # per-worker throughput: imbalance shows up here
            row[f"rollout/worker{k}_tokens_per_s"] = m["rollout/tokens_per_s"]
        row["rollout/worker_generate_s_mean"] = sum(m["rollout/generate_s"] for _, m in results) / len(results)
        lengths = [len(t.response_ids) for t in trajs]
        row["rollout/response_len_mean"] = sum(lengths) / len(lengths)
        row["rollout/truncated_frac"] = sum(t.finish_reason == "length" for t in trajs) / len(trajs)
        for key in sorted({k for _, m in results for k in m if k.startswith("memory/")}):  # the largest engine
            row[key] = max(m.get(key, 0.0) for _, m in results)
        return row
