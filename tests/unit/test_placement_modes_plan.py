"""Unit tests of the placement modes (orchestrator/placement/plan.py): bundles per mode, tensor-parallel
engine groups, the fake-GPU core mapping, node hints, the config checks, and the engine's sleep/wake
bookkeeping (actors/rollout/sleep_state.py). No Ray, no vLLM; every expectation is worked out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from actors.pinning import engine_env, engine_placement_kwargs, parse_cores
from actors.rollout.sleep_state import SleepState
from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.placement.groups import plan_bundles
from orchestrator.placement.plan import GroupPlan, PlacementError, engine_node_hints, map_cores, plan_job, total_asked

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"


def _cfg(*overrides: str):
    return load_config(CPU_YAML, list(overrides))


def _where(plan, role):
    return [(s.group, s.bundle) for s in plan.slots[role]]


def test_disaggregated_is_one_group_with_a_bundle_per_actor() -> None:
    plan = plan_job(_cfg("placement.resource=fake_gpu", "rollout.num_workers=2", "algo.kl_coef=0.1",
                         "placement.trainer_per_worker=1", "placement.rollout_per_worker=1"))
    assert [g.name for g in plan.groups] == ["rl-orch-job"] and plan.groups[0].strategy == "PACK"
    assert plan.groups[0].bundles == [{"fake_gpu": 1.0}, {"fake_gpu": 1.0}, {"fake_gpu": 1.0}, {"fake_gpu": 0.25},
                                      {"CPU": 0.25}]
    assert _where(plan, "trainer") == [(0, 0)] and _where(plan, "rollout") == [(0, 1), (0, 2)]
    assert _where(plan, "reference") == [(0, 3)] and _where(plan, "reward") == [(0, 4)]
    assert all(s.cores is None for ss in plan.slots.values() for s in ss)  # fake_gpus=0: no pinning
    # rollout.mode=one_step_off places exactly like sync
    same = plan_job(_cfg("placement.resource=fake_gpu", "rollout.num_workers=2", "algo.kl_coef=0.1",
                         "placement.trainer_per_worker=1", "placement.rollout_per_worker=1",
                         "rollout.mode=one_step_off", "algo.tis_cap=2.0"))
    assert same.groups == plan.groups


def test_colocated_shares_one_bundle_per_device() -> None:
    # D=2 trainer ranks, R=2 engines, KL on: 2 devices; device 0 = trainer 0 + engine 0 + reference (1/3
    # each, rounded down to Ray's 1e-4 grain), device 1 = trainer 1 + engine 1 (1/2 each)
    plan = plan_job(_cfg("placement.mode=colocated", "placement.resource=GPU", "trainer.num_workers=2",
                         "rollout.num_workers=2", "algo.kl_coef=0.1"))
    assert plan.groups[0].bundles == [{"GPU": 1.0}, {"GPU": 1.0}, {"CPU": 0.25}]
    assert _where(plan, "trainer") == [(0, 0), (0, 1)] and _where(plan, "rollout") == [(0, 0), (0, 1)]
    assert _where(plan, "reference") == [(0, 0)] and _where(plan, "reward") == [(0, 2)]
    assert [s.resources for s in plan.slots["trainer"]] == [{"GPU": 0.3333}, {"GPU": 0.5}]
    assert plan.slots["rollout"][1].resources == {"GPU": 0.5}
    device0 = sum(s.resources.get("GPU", 0) for ss in plan.slots.values() for s in ss if s.bundle == 0)
    assert device0 == pytest.approx(0.9999) and device0 <= 1.0


def test_colocated_devices_are_the_larger_of_trainer_ranks_and_engine_gpus() -> None:
    # D=1, R=3: 3 devices; device 0 trainer + engine (0.5 each), devices 1, 2 an engine alone (1.0)
    plan = plan_job(_cfg("placement.mode=colocated", "rollout.num_workers=3", "algo.kl_coef=0"))
    assert len(plan.groups[0].bundles) == 4
    assert [s.resources for s in plan.slots["rollout"]] == [{"CPU": 0.5}, {"CPU": 1.0}, {"CPU": 1.0}]


def test_tensor_parallel_engines_get_strict_pack_groups() -> None:
    plan = plan_job(_cfg("placement.resource=GPU", "rollout.tensor_parallel_size=2", "rollout.num_workers=2",
                         "placement.rollout_per_worker=1", "placement.trainer_per_worker=1", "algo.kl_coef=0"))
    assert [g.name for g in plan.groups] == ["rl-orch-job", "rl-orch-rollout-0", "rl-orch-rollout-1"]
    assert plan.groups[0].bundles == [{"GPU": 1.0}, {"CPU": 0.25}]  # trainer, reward: engines moved out
    for k in (1, 2):
        assert plan.groups[k].strategy == "STRICT_PACK" and plan.groups[k].bundles == [{"GPU": 1.0}] * 2
    engine = plan.slots["rollout"][1]
    assert (engine.group, engine.bundle, engine.resources) == (2, 0, {})  # the vLLM driver asks no device
    assert engine.worker_bundles == [0, 1] and engine.worker_share == 1.0 and engine.capture_child_tasks
    assert total_asked(plan.groups) == {"GPU": 5.0, "CPU": 0.25}
    assert plan_bundles(_cfg("rollout.tensor_parallel_size=2")).roles == {"trainer": [0], "reward": [1]}


def test_colocated_tensor_parallel_engine_spans_its_devices() -> None:
    plan = plan_job(_cfg("placement.mode=colocated", "rollout.tensor_parallel_size=2", "rollout.num_workers=2",
                         "trainer.num_workers=4", "algo.kl_coef=0", "placement.resource=GPU"))
    assert plan.groups[0].bundles == [{"GPU": 1.0}] * 4 + [{"CPU": 0.25}]
    assert [(s.bundle, s.worker_bundles, s.worker_share) for s in plan.slots["rollout"]] == [
        (0, [0, 1], 0.5), (2, [2, 3], 0.5)]


def test_core_mapping_first_fit_in_plan_order() -> None:
    groups = [GroupPlan("a", [{"fake_gpu": 1.0}, {"fake_gpu": 0.5}, {"fake_gpu": 0.5}, {"CPU": 1}], "PACK"),
              GroupPlan("b", [{"fake_gpu": 0.25}, {"fake_gpu": 2.0}], "STRICT_PACK")]
    # device 0 <- 1.0; device 1 <- 0.5 + 0.5; device 2 <- 0.25; 2.0 takes the two wholly free devices 3, 4
    assert map_cores(groups, "fake_gpu", 5, [10, 11, 12, 13, 14]) == [[[10], [11], [11], []], [[12], [13, 14]]]
    with pytest.raises(PlacementError, match=r"group b bundle 1 .*asks 4.25 fake_gpu in all, placement.fake_gpus=4"):
        map_cores(groups, "fake_gpu", 4, [0, 1, 2, 3])
    with pytest.raises(PlacementError, match="fake_gpus=3 exceeds this host's 2 cores"):
        map_cores(groups, "fake_gpu", 3, [0, 1])


def test_planned_actors_get_their_cores() -> None:
    plan = plan_job(_cfg("placement.resource=fake_gpu", "placement.fake_gpus=2", "placement.trainer_per_worker=1",
                         "placement.rollout_per_worker=1", "algo.kl_coef=0"), host_cores=[4, 7])
    assert plan.slots["trainer"][0].cores == [[4]] and plan.slots["rollout"][0].cores == [[7]]
    assert plan.slots["reward"][0].cores is None  # CPU only: not pinned
    colo = plan_job(_cfg("placement.resource=fake_gpu", "placement.fake_gpus=1", "placement.mode=colocated",
                         "algo.kl_coef=0.1"), host_cores=[3])
    assert {s.cores[0][0] for r in ("trainer", "rollout", "reference") for s in colo.slots[r]} == {3}


def test_engine_env_and_vllm_kwargs() -> None:
    assert engine_env([[2]]) == {"RL_ORCH_CPU_CORES": "2", "VLLM_CPU_OMP_THREADS_BIND": "2"}
    assert engine_env([[0], [1]]) == {"RL_ORCH_CPU_CORES": "0,1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert parse_cores("0, 3") == [0, 3]
    with pytest.raises(ValueError, match="RL_ORCH_CPU_CORES"):
        parse_cores("a")
    cfg = _cfg("rollout.tensor_parallel_size=2").rollout
    assert engine_placement_kwargs(cfg, True, on_gpu=True) == {
        "enable_sleep_mode": True, "tensor_parallel_size": 2, "distributed_executor_backend": "ray"}
    assert engine_placement_kwargs(_cfg().rollout, True, on_gpu=False) == {}  # vLLM has no sleep mode on CPU


def test_engine_node_hints_spread_and_pack() -> None:
    nodes = [("n1", 4.0), ("n2", 4.0), ("n3", 1.0)]  # n3 cannot hold a TP=2 engine
    assert engine_node_hints(3, 2.0, nodes, "SPREAD") == ["n1", "n2", "n1"]
    assert engine_node_hints(3, 2.0, nodes, "PACK") == ["n1", "n1", "n2"]
    assert engine_node_hints(5, 2.0, nodes, "PACK") == ["n1", "n1", "n2", "n2", None]
    assert engine_node_hints(2, 2.0, [("n1", 8.0)], "SPREAD") == [None, None]  # one node: no hints


def test_config_checks_for_fake_gpus() -> None:
    with pytest.raises(ConfigError, match="placement.fake_gpus=2 is set with placement.resource='CPU'"):
        _cfg("placement.fake_gpus=2")
    import os

    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(ConfigError, match=f"placement.fake_gpus={too_many} exceeds this host's"):
        _cfg("placement.resource=fake_gpu", f"placement.fake_gpus={too_many}")


class _Engine:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))


def test_sleep_state_staged_wake_and_wrong_order() -> None:
    engine = _Engine()
    s = SleepState(engine)
    s.sleep(1)
    with pytest.raises(RuntimeError, match="asleep"):
        s.ensure_weights_awake("load_named_weights")
    with pytest.raises(RuntimeError, match="asleep"):
        s.ensure_awake("generate")
    s.wake_up(["weights"])
    s.ensure_weights_awake("load_named_weights")
    s.ensure_awake("generate")  # wakes the KV cache first
    assert engine.calls == [("sleep", 1), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    assert list(s.events) == [("sleep", 1), ("wake_up", ["weights"]), ("load", "load_named_weights"),
                              ("wake_up", ["kv_cache"]), ("generate", "generate")]
    with pytest.raises(ValueError, match="sleep level=3"):
        s.sleep(3)
    with pytest.raises(ValueError, match="allowed are"):
        s.wake_up(["everything"])
