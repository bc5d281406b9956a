"""Placement modes on a local Ray that advertises 4 fake GPUs on 2 CPUs (DESIGN.md: integration tests use
`ray.init(num_cpus=..., resources={"fake_gpu": 4})`).

Checks: gang scheduling fails when fake GPUs are short, naming the group and the numbers, with nothing left
reserved; tensor-parallel engine groups are reserved STRICT_PACK; colocated actors share one bundle and
pinned actors see only their cores; a 2-step tiny-model GRPO run in colocated mode makes the engine's
sleep/wake calls in the right order.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import ray
from ray.util import placement_group_table

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.runtime.faults import fault_hook
from orchestrator.placement.start import actor_options
from orchestrator.placement.groups import PlacementError, remove_groups, reserve_groups
from orchestrator.placement.plan import plan_job
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


@pytest.fixture(scope="module")
def ray_fake_gpus():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, resources={"fake_gpu": 4}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING"}})
    yield
    ray.shutdown()


def _cfg(*overrides: str, model=None, out=None):
    base = tiny_overrides(model, out) + [REWARD] if model is not None else []
    return load_config("configs/grpo_arith_cpu.yaml", base + ["placement.resource=fake_gpu", *overrides])


def _live_groups() -> dict:
    return {k: v["name"] for k, v in placement_group_table().items() if v["state"] != "REMOVED"}


def test_gang_failure_names_the_group_and_leaves_nothing_reserved(ray_fake_gpus, tiny_model, tmp_path):
    # trainer 1 + two TP=2 engines x 1 = 5 fake GPUs; the cluster has 4
    cfg = _cfg("placement.trainer_per_worker=1", "placement.rollout_per_worker=1", "rollout.num_workers=2",
               "rollout.tensor_parallel_size=2", "algo.kl_coef=0", "placement.timeout_s=2", model=tiny_model,
               out=tmp_path)
    controller = GRPOController(cfg)
    with pytest.raises(PlacementError) as err:
        controller.run()
    controller.shutdown()
    msg = str(err.value)
    assert "fake_gpu: need 5, cluster has 4" in msg
    assert "group rl-orch-rollout-" in msg and "STRICT_PACK" in msg and "{'fake_gpu': 1.0}" in msg
    assert "Every placement group was removed" in msg
    assert _live_groups() == {}  # nothing left reserved


def _free_fake_gpus_settle_at_zero(timeout_s: float = 10.0) -> bool:
    """Whether Ray's view of free fake GPUs reaches 0: the view is updated from the raylet's resource reports a moment
    after a group is created (a loaded machine saw 1.0 free right after the groups were CREATED, 2026-12-06)."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("fake_gpu", 0.0) != 0.0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_tensor_parallel_groups_are_strict_pack_and_fit_exactly(ray_fake_gpus):
    cfg = _cfg("placement.trainer_per_worker=1", "placement.rollout_per_worker=0.5", "rollout.num_workers=2",
               "rollout.tensor_parallel_size=2", "algo.kl_coef=0.1", "placement.reference_per_worker=1")
    plan = plan_job(cfg)  # trainer 1 + reference 1 + 2 engines x 2 bundles x 0.5 = 4 fake GPUs: all of them
    pgs = reserve_groups(plan.groups, 10, "fake_gpu")
    try:
        table = {v["name"]: v for v in placement_group_table().values() if v["state"] == "CREATED"}
        assert set(table) == {"rl-orch-job", "rl-orch-rollout-0", "rl-orch-rollout-1"}
        assert table["rl-orch-rollout-1"]["strategy"] == "STRICT_PACK"
        assert list(table["rl-orch-rollout-1"]["bundles"].values()) == [{"fake_gpu": 0.5}] * 2
        assert _free_fake_gpus_settle_at_zero()
    finally:
        remove_groups(pgs)
    assert _live_groups() == {}


@ray.remote
class _Probe:
    """Pins itself like the job's actors do (first thing in the constructor) and reports where it runs."""

    def __init__(self):
        from actors.pinning import pin_from_env

        pin_from_env()

    def where(self):
        ctx = ray.get_runtime_context()
        return sorted(os.sched_getaffinity(0)), ctx.get_placement_group_id(), ctx.get_assigned_resources()


def test_colocated_actors_share_a_bundle_and_see_their_cores(ray_fake_gpus):
    cfg = _cfg("placement.mode=colocated", "placement.fake_gpus=2", "trainer.num_workers=2",
               "rollout.num_workers=2", "algo.kl_coef=0.1", "trainer.micro_batch_size=2")
    plan = plan_job(cfg)
    pgs = reserve_groups(plan.groups, 10, "fake_gpu")
    try:
        probes = {(r, k): _Probe.options(**actor_options(plan, pgs, r, k)).remote()
                  for r in ("trainer", "rollout", "reference") for k in range(len(plan.slots[r]))}
        seen = {key: ray.get(p.where.remote()) for key, p in probes.items()}
    finally:
        remove_groups(pgs)
    cores = sorted(os.sched_getaffinity(0))[:2]
    # device 0 = core 0: trainer 0, engine 0, reference (1/3 fake GPU each); device 1 = core 1: trainer 1, engine 1
    assert seen[("trainer", 0)][0] == seen[("rollout", 0)][0] == seen[("reference", 0)][0] == [cores[0]]
    assert seen[("trainer", 1)][0] == seen[("rollout", 1)][0] == [cores[1]]
    assert len({pg for _, pg, _ in seen.values()}) == 1  # one placement group
    assert seen[("reference", 0)][2] == {"fake_gpu": 0.3333} and seen[("trainer", 1)][2] == {"fake_gpu": 0.5}


# The same run serves the colocated fault window and colocated elastic rollout (docs/elastic.md): an engine is added
# after step 1 (scripted decision) in a placement group of its own; it generates in step 2 and never sleeps. Rollout
# worker 0 is killed (SIGKILL) as step 2's sleep call reaches it (orchestrator/runtime/faults.py fault_hook); it is
# replaced in its bundle, synced to version 1, put to sleep, and the run goes on.
def test_colocated_grpo_two_steps_sleep_and_wake_in_order(ray_fake_gpus, tiny_model, tmp_path, monkeypatch):
    import orchestrator.placement.elastic_pool as elastic_pool
    from orchestrator.placement.elastic import PoolDecision

    cfg = _cfg("placement.mode=colocated", "placement.fake_gpus=1", "algo.kl_coef=0.05",
               "weight_sync.strategy=object_store", "placement.elastic=true", "rollout.max_workers=2",
               "sizing.warmup_steps=1", model=tiny_model, out=tmp_path)
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: PoolDecision(
        "add" if room else "hold", engines, f"placement.elastic: {'add' if room else 'hold'} (scripted)"))
    controller = GRPOController(cfg)
    sleeps, killed = [], []

    def kill_at_second_sleep(window: str, k: int, handle) -> None:
        sleeps.extend([k] if window == "sleep" else [])
        if window == "sleep" and len(sleeps) == 2 and not killed:
            killed.append(ray.get(handle.pid.remote()))
            os.kill(killed[0], signal.SIGKILL)

    try:
        with fault_hook(kill_at_second_sleep):
            result = controller.run()
        worker, added = controller.actors.rollout
        events, added_events = ray.get([worker.sleep_events.remote(), added.sleep_events.remote()])
        affinity = ray.get(worker.cpu_affinity.remote())
        new_pid = ray.get(worker.pid.remote())
        groups = _live_groups()
    finally:
        controller.shutdown()
    assert [r["step"] for r in result.rows] == [1, 2]
    assert all(r["colocate/sleep_s"] >= 0 and r["colocate/wake_s"] >= 0 for r in result.rows)
    assert killed and new_pid != killed[0] and [r["faults/restarts_total"] for r in result.rows] == [0, 1]
    assert affinity == sorted(os.sched_getaffinity(0))[:1]  # the engine is pinned to fake GPU 0's core
    assert sleeps == [0, 0, 0]  # only the engine sharing the trainer's device sleeps (its replacement: step 2)
    assert [r["engines/active"] for r in result.rows] == [1, 2] and result.rows[0]["elastic/added"] == 1
    assert "rollout/worker1_tokens_per_s" in result.rows[1]  # step 2 generated on both engines
    assert sorted(groups.values()) == ["rl-orch-engine-1", "rl-orch-job"]
    kinds = [e[0] if e[0] != "wake_up" else f"wake_up:{','.join(e[1])}" for e in events]
    kinds = ["probe" if e == ("generate", "probe") else k for e, k in zip(events, kinds)]
    step = ["sleep", "wake_up:weights", "load", "wake_up:kv_cache", "probe"]
    # each step: generate -> sleep (train) -> wake weights -> weight load -> the sync's logprob probe wakes the KV
    # cache (weight_sync.probe; without it the next generate does). The replacement (step 2) is synced to version 1
    # and probed first, then sleeps for step 2's training.
    assert kinds == ["load", "probe"] + step, events
    # the added engine: synced to version 1 and probed when it joined, generated step 2, loaded version 2; no sleep
    assert [e[0] for e in added_events if e[0] in ("sleep", "wake_up", "load")] == ["load", "load"], added_events
