"""Unit tests of orchestrator.algo.advantages (GRPO, Dr. GRPO, RLOO), including case C04."""

from __future__ import annotations

import pytest
import torch

from orchestrator.algo import compute_advantages

ESTIMATORS = ["grpo", "dr_grpo", "rloo"]


def _ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_hand_values_each_estimator() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0])
    ids = _ids(5, 5, 5)
    # mean 2, unbiased std 1
    grpo = compute_advantages(rewards, ids, "grpo", eps=1e-6)
    torch.testing.assert_close(grpo, torch.tensor([-1.0, 0.0, 1.0]) / (1.0 + 1e-6), atol=1e-7, rtol=0)
    torch.testing.assert_close(compute_advantages(rewards, ids, "dr_grpo"), torch.tensor([-1.0, 0.0, 1.0]))
    # leave-one-out: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5
    torch.testing.assert_close(compute_advantages(rewards, ids, "rloo"), torch.tensor([-1.5, 0.0, 1.5]))
    assert grpo.dtype == torch.float32


def test_grpo_matches_torch_std_per_group() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=gen, dtype=torch.float64)
    ids = _ids(*([3, 1, 2] * 4))
    adv = compute_advantages(rewards, ids, "grpo", eps=1e-6)
    for g in (1, 2, 3):
        sel = ids == g
        r = rewards[sel]
        expected = ((r - r.mean()) / (r.std() + 1e-6)).float()
        torch.testing.assert_close(adv[sel], expected, atol=1e-6, rtol=0)


def test_rloo_equals_explicit_leave_one_out() -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.5, 2.0, -1.0])
    ids = _ids(0, 0, 0, 0, 1, 1)
    adv = compute_advantages(rewards, ids, "rloo")
    expected = []
    for i in range(6):
        others = [rewards[j] for j in range(6) if j != i and ids[j] == ids[i]]
        expected.append(rewards[i] - torch.stack(others).mean())
    torch.testing.assert_close(adv, torch.stack(expected))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_c04_identical_prompts_different_groups_are_all_zero(estimator: str) -> None:
    # Group A all 0, group B all 1; prompts identical, so only the group id separates them.
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = compute_advantages(rewards, _ids(0, 0, 0, 0, 1, 1, 1, 1), estimator)
    assert torch.equal(adv, torch.zeros(8))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_c04_interleaved_groups_are_all_zero(estimator: str) -> None:
    rewards = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = compute_advantages(rewards, _ids(10, 20, 10, 20, 10, 20, 10, 20), estimator)
    assert torch.equal(adv, torch.zeros(8))


def test_c04_the_fault_value_appears_only_when_groups_are_merged() -> None:
    rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    merged = compute_advantages(rewards, torch.zeros(8, dtype=torch.int64), "rloo")
    torch.testing.assert_close(merged.abs(), torch.full((8,), 4.0 / 7.0))  # about 0.571
    assert merged[0].item() == pytest.approx(-0.571428, abs=1e-5)


def test_c04_interleaved_non_uniform_groups_stay_together() -> None:
    rewards = torch.tensor([1.0, 5.0, 3.0, 7.0])
    adv = compute_advantages(rewards, _ids(1, 2, 1, 2), "dr_grpo")
    torch.testing.assert_close(adv, torch.tensor([-1.0, -1.0, 1.0, 1.0]))
    # permuting the batch permutes the advantages
    perm = torch.tensor([3, 0, 2, 1])
    permuted = compute_advantages(rewards[perm], _ids(1, 2, 1, 2)[perm], "dr_grpo")
    torch.testing.assert_close(permuted, adv[perm])


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_uniform_and_singleton_groups_are_exactly_zero(estimator: str) -> None:
    # 0.1 * 3 is not exact in floating point: the zero must not come from arithmetic luck.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.3, 0.9])
    ids = _ids(0, 0, 0, 1, 2, 2)
    adv = compute_advantages(rewards, ids, estimator, eps=0.0)
    assert torch.equal(adv[:4], torch.zeros(4))  # uniform group and a group of size 1
    assert torch.isfinite(adv).all()
    assert adv[4].item() < 0 < adv[5].item()


def test_empty_batch() -> None:
    adv = compute_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.int64))
    assert adv.shape == (0,) and adv.dtype == torch.float32


@pytest.mark.parametrize(
    ("rewards", "ids", "kwargs", "match"),
    [
        (torch.zeros(3), _ids(0, 0), {}, "group_ids"),
        (torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.int64), {}, "rewards"),
        (torch.zeros(3), torch.zeros(3, 1, dtype=torch.int64), {}, "group_ids"),
        (torch.zeros(3), torch.zeros(3), {}, "group_ids"),
        (torch.tensor([0.0, float("nan")]), _ids(0, 0), {}, "rewards"),
        (torch.tensor([0.0, float("inf")]), _ids(0, 0), {}, "rewards"),
        (torch.zeros(2), _ids(0, 0), {"estimator": "ppo"}, r"estimator.*grpo.*rloo.*dr_grpo"),
    ],
)
def test_errors(rewards: torch.Tensor, ids: torch.Tensor, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_advantages(rewards, ids, **kwargs)
