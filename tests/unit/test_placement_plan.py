"""Unit tests of the pure parts of orchestrator.placement: the bundle plan and the missing-resource report.

Nothing here starts Ray (`reserve` and `bundle_options` need a cluster and are covered by integration tests).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.placement.groups import RolePlan, missing_resources, plan_bundles

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"


def _plan(*overrides: str) -> RolePlan:
    return plan_bundles(load_config(CPU_YAML, list(overrides)))


def test_default_cpu_plan() -> None:
    plan = _plan("algo.kl_coef=0", "rollout.num_workers=1", "placement.resource=CPU")
    assert plan.bundles == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 0.25}]
    assert plan.roles == {"trainer": [0], "rollout": [1], "reward": [2]}


def test_kl_adds_a_reference_bundle() -> None:
    plan = _plan("algo.kl_coef=0.01", "rollout.num_workers=1")
    assert plan.bundles == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 0.25}, {"CPU": 0.25}]
    assert plan.roles == {"trainer": [0], "rollout": [1], "reference": [2], "reward": [3]}
    assert "reference" not in _plan("algo.kl_coef=0").roles


def test_three_rollout_workers() -> None:
    plan = _plan("rollout.num_workers=3", "algo.kl_coef=0")
    assert plan.roles == {"trainer": [0], "rollout": [1, 2, 3], "reward": [4]}
    assert [plan.bundles[i] for i in plan.roles["rollout"]] == [{"CPU": 0.5}] * 3
    assert len(plan.bundles) == 5


def test_resource_name_from_config() -> None:
    plan = _plan("placement.resource=fake_gpu", "rollout.num_workers=2", "algo.kl_coef=0.1",
                 "placement.trainer_per_worker=1", "placement.rollout_per_worker=1",
                 "placement.reference_per_worker=0.5", "placement.reward_cpus=1")
    assert plan.bundles == [{"fake_gpu": 1.0}, {"fake_gpu": 1.0}, {"fake_gpu": 1.0}, {"fake_gpu": 0.5},
                            {"CPU": 1.0}]  # the reward actor always asks for CPU
    assert plan.roles == {"trainer": [0], "rollout": [1, 2], "reference": [3], "reward": [4]}
    gpu = _plan("placement.resource=GPU")
    assert gpu.bundles[0] == {"GPU": 0.5} and gpu.bundles[-1] == {"CPU": 0.25}


def test_zero_amounts_give_a_tiny_cpu_bundle_not_an_empty_one() -> None:
    plan = _plan("placement.trainer_per_worker=0", "placement.reward_cpus=0", "algo.kl_coef=0")
    assert plan.bundles == [{"CPU": 0.01}, {"CPU": 0.5}, {"CPU": 0.01}]
    assert all(plan.bundles)  # Ray rejects empty bundles


def test_every_bundle_belongs_to_exactly_one_role() -> None:
    plan = _plan("rollout.num_workers=4", "algo.kl_coef=0.05")
    indices = sorted(i for idx in plan.roles.values() for i in idx)
    assert indices == list(range(len(plan.bundles))) == list(range(7))


def test_missing_resources_hand_values() -> None:
    bundles = [{"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 0.5}, {"CPU": 1.0}, {"CPU": 0.5, "memory": 2.0}]
    # 2.5 GPUs, 1.5 CPUs, 2 memory needed
    assert missing_resources(bundles, {"GPU": 4.0, "CPU": 8.0, "memory": 10.0}) == {}
    assert missing_resources(bundles, {"GPU": 2.0, "CPU": 8.0, "memory": 10.0}) == {"GPU": (2.5, 2.0)}
    assert missing_resources(bundles, {"CPU": 1.0}) == {"GPU": (2.5, 0.0), "CPU": (1.5, 1.0), "memory": (2.0, 0.0)}
    assert missing_resources([], {}) == {}


def test_missing_resources_exact_fit_and_float_sums() -> None:
    # 0.1 summed ten times is 0.9999999999999999 in floats: an exact fit must not be reported
    assert missing_resources([{"fake_gpu": 0.1}] * 10, {"fake_gpu": 1.0}) == {}
    assert missing_resources([{"fake_gpu": 0.1}] * 11, {"fake_gpu": 1.0}) == {"fake_gpu": (pytest.approx(1.1), 1.0)}
    assert missing_resources([{"CPU": 2.0}], {"CPU": 2.0}) == {}


def test_missing_resources_of_a_planned_job() -> None:
    plan = _plan("placement.resource=fake_gpu", "rollout.num_workers=3", "algo.kl_coef=0.1",
                 "placement.trainer_per_worker=1", "placement.rollout_per_worker=1",
                 "placement.reference_per_worker=1")
    # trainer 1 + rollout 3 + reference 1 = 5 fake GPUs; the reward actor 0.25 CPU
    assert missing_resources(plan.bundles, {"fake_gpu": 4.0, "CPU": 2.0}) == {"fake_gpu": (5.0, 4.0)}
    assert missing_resources(plan.bundles, {"fake_gpu": 5.0, "CPU": 0.0}) == {"CPU": (0.25, 0.0)}
