"""Placement on GPUs: a tensor-parallel (TP=2) vLLM engine in its own STRICT_PACK placement group, and a
colocated GRPO run where vLLM really sleeps while the trainer trains (sleep mode exists only on GPUs).

Marked `gpu`: skipped without CUDA (the TP test also needs 2 GPUs); run with `pytest -m gpu tests/gpu`.
"""
from __future__ import annotations

import json

import pytest
import ray
import torch

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.start import actor_options
from orchestrator.placement.groups import remove_groups, reserve_groups
from orchestrator.placement.plan import plan_job
from orchestrator.rollout import PromptRequest
from tests.integration.conftest import ray_local, tiny_model, tiny_overrides  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"
GPU = ["placement.resource=GPU", "rollout.dtype=bfloat16", "trainer.precision=bf16-autocast"]


def test_tensor_parallel_engine_in_its_strict_pack_group(ray_local, tiny_model, tmp_path):  # noqa: F811
    if torch.cuda.device_count() < 2:
        pytest.skip(f"TP=2 needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    from actors.rollout.worker import RolloutWorkerActor

    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + GPU + [
        "rollout.tensor_parallel_size=2", "placement.rollout_per_worker=1", "placement.trainer_per_worker=0",
        "algo.kl_coef=0", "rollout.gpu_memory_utilization=0.3"])
    plan = plan_job(cfg)
    pgs = reserve_groups(plan.groups, 60, "GPU")
    try:
        table = ray.util.placement_group_table(pgs[1])
        assert table["strategy"] == "STRICT_PACK" and len(table["bundles"]) == 2
        worker = RolloutWorkerActor.options(**actor_options(plan, pgs, "rollout", 0)).remote(
            str(tiny_model), cfg.rollout, 0)
        trajs, metrics = ray.get(worker.generate.remote([PromptRequest(group_id=0, prompt_ids=[1, 2, 3], answer="")]),
                                 timeout=600)
        assert len(trajs) == cfg.rollout.n and metrics["rollout/tokens"] > 0
        assert ray.available_resources().get("GPU", 0.0) <= torch.cuda.device_count() - 2  # the group holds 2 GPUs
    finally:
        remove_groups(pgs)


def test_colocated_run_sleeps_vllm_on_gpu(ray_local, tiny_model, tmp_path):  # noqa: F811
    over = tiny_overrides(tiny_model, tmp_path) + GPU + [
        REWARD, "placement.mode=colocated", "rollout.gpu_memory_utilization=0.3", "algo.kl_coef=0.05",
        "weight_sync.strategy=object_store"]
    controller = GRPOController(load_config("configs/grpo_arith_cpu.yaml", over))
    try:
        result = controller.run()
        events = ray.get(controller.actors.rollout[0].sleep_events.remote())
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["sync/version"] == 2  # verified syncs after waking
    assert [e[0] for e in events] == ["generate", "sleep", "wake_up", "load", "wake_up", "generate", "sleep",
                                      "wake_up", "load"]
    assert rows[0]["actor/logprob_gap_abs"] < 0.05  # the engine woke with the trainer's weights


@pytest.mark.parametrize("strategy", ["nccl", "object_store"])
def test_tensor_parallel_engine_passes_the_verified_weight_sync(ray_local, tiny_model, tmp_path, strategy):  # noqa: F811
    """TP=2: each worker joins the NCCL group at its own rank and reports the full tensors it loaded; the
    engine's workers agree and match the trainer, so a 2-step GRPO run syncs verified weights each step."""
    if torch.cuda.device_count() < 3:
        pytest.skip(f"TP=2 plus a trainer needs 3 GPUs, this machine has {torch.cuda.device_count()}")
    over = tiny_overrides(tiny_model, tmp_path) + GPU + [
        REWARD, "rollout.tensor_parallel_size=2", "rollout.gpu_memory_utilization=0.3", "algo.kl_coef=0",
        f"weight_sync.strategy={strategy}", "weight_sync.verify=true"]
    controller = GRPOController(load_config("configs/grpo_arith_cpu.yaml", over))
    try:
        result = controller.run()
        report = ray.get(controller.actors.rollout[0].checksums.remote())
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["sync/version"] for r in rows] == [1, 2]
    assert report["tp_workers"] == 2 and report["verified_on"] == "load" and report["version"] == 2
    assert rows[-1]["actor/logprob_gap_abs"] < 0.05  # both shards hold the new weights
