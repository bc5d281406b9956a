"""REINFORCE++ and REINFORCE++-baseline (orchestrator/algo/reinforce.py): hand-computed values, global whitening."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.algo import ADVANTAGE_ESTIMATORS, AdvantageConfig, AdvantageInputs, compute_token_advantages, import_plugins
from orchestrator.algo.registry import plugin_module_name
from orchestrator.config import load_config

REPO = Path(__file__).resolve().parents[2]
CFG = AdvantageConfig(adv_eps=0.0)


def test_reinforce_plus_plus_hand_values() -> None:
    # rewards [1, 0, 0.5]; sample 0 has 2 response tokens, samples 1 and 2 one each (the group ids play no part).
    # token values 1, 1, 0, 0.5: mean 2.5 / 4 = 0.625; centred 0.375, 0.375, -0.625, -0.125;
    # unbiased var = (2 * 0.140625 + 0.390625 + 0.015625) / 3 = 0.6875 / 3
    mask = torch.tensor([[1, 1], [1, 0], [1, 0]])
    adv = compute_token_advantages("reinforce_plus_plus", AdvantageInputs(
        torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1]), mask), CFG)
    s = math.sqrt(0.6875 / 3)
    expected = torch.tensor([[0.375 / s, 0.375 / s], [-0.625 / s, 0.0], [-0.125 / s, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    assert adv[1, 0].item() == pytest.approx(-1.305582, abs=1e-5)
    assert adv.dtype == torch.float32 and adv.shape == (3, 2)


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens_globally() -> None:
    # rewards [1, 0 | 0.5, 0.5] in groups 0 and 1; group means 0.5, 0.5 -> a = [0.5, -0.5, 0, 0].
    # tokens (sample 0 has 2): 0.5, 0.5, -0.5, 0, 0: mean 0.1; centred 0.4, 0.4, -0.6, -0.1, -0.1;
    # unbiased var = (0.16 * 2 + 0.36 + 0.01 * 2) / 4 = 0.175. The uniform group 1 gets -0.1 / std, not 0.
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 0]])
    adv = compute_token_advantages("reinforce_plus_plus_baseline", AdvantageInputs(
        torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([7, 7, 3, 3]), mask), CFG)
    s = math.sqrt(0.175)
    expected = torch.tensor([[0.4 / s, 0.4 / s], [-0.6 / s, 0.0], [-0.1 / s, 0.0], [-0.1 / s, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    assert adv[0, 0].item() == pytest.approx(0.956183, abs=1e-5)
    # the group mean matters: interleaved ids give the same numbers as sorted ones (ids, never content)
    perm = torch.tensor([2, 0, 3, 1])
    again = compute_token_advantages("reinforce_plus_plus_baseline", AdvantageInputs(
        torch.tensor([1.0, 0.0, 0.5, 0.5])[perm], torch.tensor([7, 7, 3, 3])[perm], mask[perm]), CFG)
    torch.testing.assert_close(again, expected[perm], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_degenerate_batches_give_zero_never_nan(name: str) -> None:
    equal = AdvantageInputs(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0, 0, 1]), torch.tensor([[1, 1], [1, 0], [1, 0]]))
    assert torch.equal(compute_token_advantages(name, equal, AdvantageConfig()), torch.zeros(3, 2))
    one_token = AdvantageInputs(torch.tensor([2.0, 0.0]), torch.tensor([0, 0]), torch.tensor([[1, 0], [0, 0]]))
    assert torch.equal(compute_token_advantages(name, one_token, AdvantageConfig()), torch.zeros(2, 2))


def test_eps_is_algo_adv_eps() -> None:
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([[1], [1]]))
    # a = [1, 0]: mean 0.5, unbiased std sqrt(0.5); A = +-0.5 / (sqrt(0.5) + 0.5)
    adv = compute_token_advantages("reinforce_plus_plus", inputs, AdvantageConfig(adv_eps=0.5))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 0.5), atol=1e-6, rtol=0)


def test_built_in_equals_the_worked_example_on_outcome_rewards() -> None:
    """docs/examples/custom_estimator.py registers `reinforce_pp` (gamma = 1 returns): with outcome rewards its
    returns are r_i on every token, so it must give the built-in's numbers."""
    path = REPO / "docs" / "examples" / "custom_estimator.py"
    had = "reinforce_pp" in ADVANTAGE_ESTIMATORS.names()
    import_plugins([str(path)])
    try:
        g = torch.Generator().manual_seed(3)
        rewards = torch.rand(8, generator=g)
        mask = (torch.arange(6)[None, :] < torch.randint(1, 7, (8, 1), generator=g)).int()
        inputs = AdvantageInputs(rewards, torch.arange(8) // 4, mask)
        ours = compute_token_advantages("reinforce_plus_plus", inputs, AdvantageConfig())
        theirs = compute_token_advantages("reinforce_pp", inputs, AdvantageConfig())
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    finally:
        if not had:
            ADVANTAGE_ESTIMATORS.unregister("reinforce_pp")
            sys.modules.pop(plugin_module_name(path), None)


def test_the_config_accepts_both_names() -> None:
    for name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        assert load_config(REPO / "configs" / "grpo_arith_cpu.yaml", [f"algo.estimator={name}"]).algo.estimator == name
