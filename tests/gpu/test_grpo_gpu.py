"""The GRPO step on a GPU: trainer on CUDA, vLLM (official build) on CUDA, bundles of `GPU`.

Marked `gpu`: skipped without CUDA; run on a GPU machine with `pytest -m gpu tests/gpu`.
"""
from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import ray_local, tiny_model, tiny_overrides  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def test_two_steps_on_gpu(ray_local, tiny_model, tmp_path):  # noqa: F811
    over = tiny_overrides(tiny_model, tmp_path) + [
        REWARD, "placement.resource=GPU", "placement.trainer_per_worker=0.5", "placement.rollout_per_worker=0.5",
        "rollout.dtype=bfloat16", "trainer.precision=bf16-autocast", "rollout.gpu_memory_utilization=0.3"]
    controller = GRPOController(load_config("configs/grpo_arith_cpu.yaml", over))
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["sync/version"] == 2
    assert rows[0]["actor/logprob_gap_abs"] < 0.05  # bf16 engine vs bf16-autocast trainer
