"""Weight sync on a GPU: the NCCL backend of ray.util.collective (cupy), trainer and one vLLM engine
on CUDA, bit-exact engine weights after real optimizer steps; plus the GRPO loop with `nccl`.

Marked `gpu`: skipped without CUDA; run on a GPU machine with `pytest -m gpu tests/gpu`.
"""
from __future__ import annotations

import pytest
import ray

from actors.rollout.worker import RolloutWorkerActor
from actors.trainer.trainer import TrainerActor
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.weight_sync.syncer import make_syncer
from tests.integration.conftest import ray_local, tiny_model, tiny_overrides  # noqa: F401 (fixtures)
from tests.integration.test_weight_sync import REWARD_OVERRIDE, _assert_bit_exact, _train_once

pytestmark = pytest.mark.gpu
GPU = ["placement.resource=GPU", "placement.trainer_per_worker=0.5", "placement.rollout_per_worker=0.5",
       "rollout.dtype=bfloat16", "trainer.precision=bf16-autocast", "rollout.gpu_memory_utilization=0.3",
       "weight_sync.strategy=nccl", "weight_sync.bucket_mb=8"]


def _two_syncs_bit_exact(model, cfg, gpus: float = 0.5) -> dict:
    """A trainer and one engine, `gpus` GPUs each (0.5: sharing one), synced at versions 1 and 2 (a real optimizer
    step between), bit-exact each time; returns the syncer's info."""
    trainer = TrainerActor.options(num_gpus=gpus).remote(str(model), cfg.trainer, cfg.algo, 1.0, 12, 0)
    engine = RolloutWorkerActor.options(num_gpus=gpus).remote(str(model), cfg.rollout, 0)
    ray.get([trainer.ready.remote(), engine.ready.remote(), engine.extension_call.remote("record_digests", True)])
    try:
        syncer = make_syncer(cfg, trainer, [engine])
        for version in (1, 2):
            if version > 1:
                _train_once(trainer, version)
            syncer.sync(version)
            _assert_bit_exact(trainer, [engine], "bfloat16", ids=(0,))
        return syncer.info
    finally:
        ray.kill(trainer)
        ray.kill(engine)


def test_nccl_broadcast_is_bit_exact_on_gpu(ray_local, tiny_model, tmp_path):  # noqa: F811
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + GPU)
    assert _two_syncs_bit_exact(tiny_model, cfg)["backend"].lower() == "nccl"


def test_grpo_loop_with_nccl_sync_on_gpu(ray_local, tiny_model, tmp_path):  # noqa: F811
    over = tiny_overrides(tiny_model, tmp_path) + GPU + [REWARD_OVERRIDE]
    controller = GRPOController(load_config("configs/grpo_arith_cpu.yaml", over))
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    assert result.rows[-1]["sync/version"] == 2 and result.rows[-1]["sync/buckets"] >= 1


@pytest.mark.parametrize("engine_kind", ["in_process", "async_llm"])
@pytest.mark.parametrize("strategy", ["vllm_nccl", "vllm_ipc"])
def test_vllm_native_transfer_is_bit_exact_on_gpu(ray_local, tiny_model, tmp_path, strategy, engine_kind):  # noqa: F811
    """weight_sync.strategy=vllm_nccl / vllm_ipc: vLLM's NCCLWeightTransferEngine / IPCWeightTransferEngine in the
    engine (in this actor's process, or in AsyncLLM's core, which is no Ray worker); bit-exact after real steps. ipc:
    the trainer and the engine share one GPU (colocated); nccl: a GPU each (NCCL refuses two ranks on one GPU)."""
    import torch

    if strategy == "vllm_nccl" and torch.cuda.device_count() < 2:
        pytest.skip("vllm_nccl needs two GPUs: the trainer and the engine on one GPU each")
    over = [o for o in GPU if not o.startswith("weight_sync.strategy")] + [
        f"weight_sync.strategy={strategy}", f"rollout.engine={engine_kind}", "rollout.num_workers=1"]
    if strategy == "vllm_ipc":
        over.append("placement.mode=colocated")
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + over)
    info = _two_syncs_bit_exact(tiny_model, cfg, gpus=1.0 if strategy == "vllm_nccl" else 0.5)
    assert info["world_size"] == 2 if strategy == "vllm_nccl" else info == {}
