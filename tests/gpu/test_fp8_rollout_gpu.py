"""FP8 rollouts on a GPU (rollout.quantization=fp8, vLLM's online per-tensor FP8): the trainer's bf16 weights are
synced into an FP8 engine through vLLM's layerwise reload, which re-quantises them; the sync verifies the stream's
checksums and that every FP8 layer's resident weight and scale equal vLLM's re-quantisation of the loaded weights
bit for bit (orchestrator/weight_sync/fp8_check.py); a changed resident scale is caught; the engine scores the
logprob probe after each sync (its difference from the trainer is printed: the by-dtype probe tolerance was
measured on 16-bit engines, so the test sets a loose one and reports the number).

Marked `gpu`: needs CUDA with FP8 support (vLLM's FP8 kernels; compute capability >= 8.9 for W8A8);
run with `pytest -m gpu tests/gpu/test_fp8_rollout_gpu.py -s`. Not run where it was written (no GPU there).
"""
from __future__ import annotations

import pytest
import ray

from actors.rollout.worker import RolloutWorkerActor
from actors.trainer.trainer import TrainerActor
from orchestrator.config import load_config
from orchestrator.weight_sync.checksum import WeightMismatchError
from orchestrator.weight_sync.fp8_check import check_fp8_report
from orchestrator.weight_sync.syncer import make_syncer
from tests.integration.conftest import ray_local, tiny_model, tiny_overrides  # noqa: F401 (fixtures)
from tests.integration.test_weight_sync import _train_once

pytestmark = pytest.mark.gpu
FP8 = ["placement.resource=GPU", "placement.trainer_per_worker=0.5", "placement.rollout_per_worker=0.5",
       "rollout.dtype=bfloat16", "trainer.precision=bf16-autocast", "rollout.gpu_memory_utilization=0.3",
       "rollout.quantization=fp8", "rollout.kv_cache_dtype=fp8", "weight_sync.bucket_mb=1",
       "weight_sync.probe_tolerance=50"]  # the probe runs and prints its difference; FP8 has no measured tolerance


@pytest.mark.parametrize("strategy", ["nccl", "object_store"])
def test_fp8_engine_sync_is_verified_on_gpu(ray_local, tiny_model, tmp_path, strategy):  # noqa: F811
    cfg = load_config("configs/grpo_arith_cpu.yaml",
                      tiny_overrides(tiny_model, tmp_path) + FP8 + [f"weight_sync.strategy={strategy}"])
    trainer = TrainerActor.options(num_gpus=0.5).remote(str(tiny_model), cfg.trainer, cfg.algo, 1.0, 12, 0)
    engine = RolloutWorkerActor.options(num_gpus=0.5).remote(str(tiny_model), cfg.rollout, 0)
    ray.get([trainer.ready.remote(), engine.ready.remote()])
    try:
        syncer = make_syncer(cfg, trainer, [engine])
        for version in (1, 2):
            if version > 1:
                _train_once(trainer, version)
            metrics = syncer.sync(version)  # raises WeightMismatchError unless the stream and FP8 layers verified
            report = ray.get(engine.weight_checksums.remote())
            assert report["version"] == version
            assert report["fp8"]["layers"] == 2 * 4 and report["fp8"]["errors"] == {}  # qkv, o, gate_up, down
            print(f"{strategy} v{version}: sync/probe_max_abs_diff={metrics['sync/probe_max_abs_diff']:.4f} nats")
        layer = ray.get(engine.extension_call.remote("corrupt_fp8_scale", 2.0))
        with pytest.raises(WeightMismatchError, match=f"FP8 layer '{layer}': resident FP8 scale changed"):
            check_fp8_report(ray.get(engine.weight_checksums.remote()), "rollout worker 0")
        _train_once(trainer, 3)
        syncer.sync(3)  # the next sync re-quantises the layer and verifies again
    finally:
        ray.kill(trainer)
        ray.kill(engine)
