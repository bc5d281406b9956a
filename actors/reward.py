"""RewardActor: the Ray actor that scores rollouts, a thin shell over `RewardScorer`.

All logic (grouping, process-pool timeout and memory limit, failure counts, output checks) lives in
`orchestrator.reward.scorer.RewardScorer`; this actor only hosts one scorer in its own process so the
controller can call it remotely::

    actor = RewardActor.remote([("accuracy", 1.0)], timeout_s=10.0)
    result = ray.get(actor.score.remote(completions, answers, group_ids))   # RewardResult
"""

from __future__ import annotations

from typing import Optional

import ray

from actors.pinning import pin_from_env_count
from orchestrator.reward.model import RewardModelScorer
from orchestrator.reward.scorer import RewardResult, RewardScorer, StartMethod


@ray.remote
class RewardActor:
    """Ray actor over `RewardScorer`; same arguments, same errors (raised as Ray task errors).

    Args:
        functions: ``[(name, weight), ...]``, built-in names or dotted paths importable in the actor.
        timeout_s: hard limit in seconds per (function, group) call.
        num_workers: worker processes of the scorer's pool.
        mp_start_method: worker start method, see `RewardScorer`.
        reward_model: ``{"path", "weight", "batch_size"}`` of a learned reward, or None. It runs in this actor's
            process, not in the pool, and is not under `memory_limit_mb`.
        memory_limit_mb: MiB of writable memory per scorer worker process (reward.memory_limit_mb; 0 = none).
    """

    def __init__(
        self,
        functions: list[tuple[str, float]],
        timeout_s: float = 10.0,
        num_workers: int = 2,
        mp_start_method: StartMethod = "forkserver",
        reward_model: Optional[dict] = None,
        memory_limit_mb: int = 4096,
    ) -> None:
        self._scorer = RewardScorer(functions, timeout_s, num_workers, mp_start_method, memory_limit_mb)
        self._model = None
        self._model_weight = 0.0
        if reward_model:  # {"path", "weight", "batch_size"}
            import torch

            # Ray gives a fractional-CPU actor OMP_NUM_THREADS=1: a CPU reward model would score on one thread
            torch.set_num_threads(pin_from_env_count())
            self._model = RewardModelScorer(reward_model["path"], batch_size=reward_model.get("batch_size", 8))
            self._model_weight = float(reward_model.get("weight", 1.0))

    def score(
        self, completions: list[str], answers: list[str], group_ids: list[int],
        prompts: Optional[list[str]] = None,
    ) -> RewardResult:
        """Score a batch; see `RewardScorer.score` (ValueError on bad reward output).

        With a reward model configured, `prompts` (B texts) are required and
        `reward_model_weight * score` is added to every reward (`reward/model_mean` in the metrics).
        """
        result = self._scorer.score(completions, answers, group_ids)
        if self._model is None:
            return result
        if prompts is None:
            raise ValueError("the reward model needs the prompt texts; pass prompts=[...]")
        scores = self._model.score(prompts, completions)
        result.per_function["reward_model"] = scores
        result.rewards = [r + self._model_weight * s for r, s in zip(result.rewards, scores)]
        result.metrics["reward/model_mean"] = sum(scores) / max(len(scores), 1)
        result.metrics["reward/mean"] = sum(result.rewards) / max(len(result.rewards), 1)
        return result

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        """Stop the scorer's worker processes."""
        self._scorer.close()
