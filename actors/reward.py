"""RewardActor: the Ray actor that scores rollouts, a thin shell over `RewardScorer`.

All logic (grouping, process-pool timeout and memory limit, failure counts, output checks) lives in
`orchestrator.reward.scorer.RewardScorer`; this actor only hosts one scorer in its own process so the
controller can call it remotely::

    actor = RewardActor.remote([("accuracy", 1.0)], timeout_s=10.0)
    result = ray.get(actor.score.remote(completions, answers, group_ids))   # RewardResult

Concurrency: the job starts it with `start_reward_actor`, which lets it run `reward_concurrency(...)` `score` calls
at once (a threaded actor). Streaming rollouts issue one call per completed group (orchestrator/rollout/
group_scores.py), so a slow reward function (a code sandbox) would otherwise score the groups one after another.
That is safe without a reward model: the reward functions run in the scorer's worker processes, and a call's
state (its futures, positions, tally) is its own; the scorer schedules under a lock (the pool starts lazily on
its first schedule) and waits outside it. A reward model runs in this process on one device, so with one the
actor stays sequential (and its forwards are also serialised by a lock, should it get more concurrency anyway).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import ray

from actors.pinning import pin_from_env_count
from orchestrator.reward.model import RewardModelScorer
from orchestrator.reward.scorer import RewardResult, RewardScorer, StartMethod


def reward_concurrency(num_workers: int, has_model: bool) -> int:
    """How many `score` calls the reward actor runs at once: 1 with a reward model in the actor (one device, one
    forward at a time), else `num_workers` (reward.num_workers, the scorer's processes: more calls would only
    queue in the pool). Raises ValueError for num_workers < 1."""
    if num_workers < 1:
        raise ValueError(f"reward num_workers must be >= 1, got {num_workers}")
    return 1 if has_model else int(num_workers)


def start_reward_actor(reward_cfg: Any, options: dict) -> Any:
    """The job's reward actor (not waited for) from the typed `reward` config, with Ray `options` (placement,
    runtime_env) and `max_concurrency` from `reward_concurrency`."""
    functions = [(f.name, f.weight) for f in reward_cfg.functions]
    rm = reward_cfg.model_path
    rm_spec = {"path": rm, "weight": reward_cfg.model_weight, "batch_size": reward_cfg.model_batch_size} if rm else None
    concurrency = reward_concurrency(reward_cfg.num_workers, has_model=rm_spec is not None)
    return RewardActor.options(**options, max_concurrency=concurrency).remote(
        functions, reward_cfg.timeout_s, reward_cfg.num_workers, reward_model=rm_spec,
        memory_limit_mb=reward_cfg.memory_limit_mb)


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
        self._scorer.start()  # the workers and the functions' imports now, while the engines start, not in step 1
        self._model = None
        self._model_weight = 0.0
        self._model_lock = threading.Lock()  # one forward at a time, whatever the actor's max_concurrency
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
        """Score a batch; see `RewardScorer.score` (ValueError on bad reward output). Thread-safe: calls may
        overlap (see the module docstring).

        With a reward model configured, `prompts` (B texts) are required and
        `reward_model_weight * score` is added to every reward (`reward/model_mean` in the metrics).
        """
        result = self._scorer.score(completions, answers, group_ids)
        if self._model is None:
            return result
        if prompts is None:
            raise ValueError("the reward model needs the prompt texts; pass prompts=[...]")
        with self._model_lock:
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
