"""RewardActor: the Ray actor that scores rollouts, a thin shell over `RewardScorer`.

All logic (grouping, process-pool timeout, output checks) lives in
`orchestrator.reward.scorer.RewardScorer`; this actor only hosts one scorer in its own process so the
controller can call it remotely::

    actor = RewardActor.remote([("accuracy", 1.0)], timeout_s=10.0)
    result = ray.get(actor.score.remote(completions, answers, group_ids))   # RewardResult
"""

from __future__ import annotations

import ray

from orchestrator.reward.scorer import RewardResult, RewardScorer, StartMethod


@ray.remote
class RewardActor:
    """Ray actor over `RewardScorer`; same arguments, same errors (raised as Ray task errors).

    Args:
        functions: ``[(name, weight), ...]``, built-in names or dotted paths importable in the actor.
        timeout_s: hard limit in seconds per (function, group) call.
        num_workers: worker processes of the scorer's pool.
        mp_start_method: worker start method, see `RewardScorer`.
    """

    def __init__(
        self,
        functions: list[tuple[str, float]],
        timeout_s: float = 10.0,
        num_workers: int = 2,
        mp_start_method: StartMethod = "forkserver",
    ) -> None:
        self._scorer = RewardScorer(functions, timeout_s, num_workers, mp_start_method)

    def score(
        self, completions: list[str], answers: list[str], group_ids: list[int]
    ) -> RewardResult:
        """Score a batch; see `RewardScorer.score` (ValueError on bad reward output)."""
        return self._scorer.score(completions, answers, group_ids)

    def close(self) -> None:
        """Stop the scorer's worker processes."""
        self._scorer.close()
