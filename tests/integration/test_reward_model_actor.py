"""The RewardActor adds a learned reward model's score to the rule-based rewards."""
from __future__ import annotations

import pytest
import ray

from actors.reward import RewardActor
from orchestrator.reward.model import RewardModelScorer
from tests.unit.test_reward_model import rm_folder  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def test_reward_actor_adds_weighted_reward_model_scores(ray_local, rm_folder):  # noqa: F811
    prompts = ["What is 2 + 2?", "What is 2 + 2?"]
    completions = ["\\boxed{4}", "5"]
    actor = RewardActor.remote([("accuracy", 1.0)], timeout_s=10.0, num_workers=1,
                               reward_model={"path": str(rm_folder), "weight": 0.5})
    result = ray.get(actor.score.remote(completions, ["4", "4"], [0, 0], prompts))
    expected_rm = RewardModelScorer(str(rm_folder)).score(prompts, completions)
    assert result.per_function["accuracy"] == [1.0, 0.0]
    actor_rm = result.per_function["reward_model"]
    # The weighting is exact within the actor's own scores ...
    assert result.rewards == pytest.approx([1.0 + 0.5 * actor_rm[0], 0.5 * actor_rm[1]], abs=1e-9)
    assert result.metrics["reward/model_mean"] == pytest.approx(sum(actor_rm) / 2, abs=1e-9)
    # ... and those scores are the model's: another process may pick other CPU kernels (CI measured a
    # 5e-4 difference on this deliberately large-initialised random model), so compare at 2e-3.
    assert actor_rm == pytest.approx(expected_rm, abs=2e-3)
    assert abs(expected_rm[0] - expected_rm[1]) > 2e-2  # the two texts' scores are told apart
    with pytest.raises(ray.exceptions.RayTaskError, match="needs the prompt texts"):
        ray.get(actor.score.remote(completions, ["4", "4"], [0, 0]))
    ray.get(actor.close.remote())
