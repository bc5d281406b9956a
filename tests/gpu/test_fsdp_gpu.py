"""FSDP2 trainer ranks on GPUs with NCCL: D = 2 gives the same update as one trainer on the same batch.

Marked `gpu`: skipped without CUDA; needs 2 GPUs (NCCL runs one rank per device). Run on a GPU machine
with `pytest -m gpu tests/gpu/test_fsdp_gpu.py`.
"""
from __future__ import annotations

import pytest
import ray
import torch

from actors.trainer.trainer import Trainer
from tests.integration.conftest import ray_local, tiny_model  # noqa: F401 (fixtures)
from tests.integration.test_fsdp import _batch, _cfgs, _ranks, assert_same_sync_weights

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: NCCL takes one rank per device")
def test_two_nccl_ranks_give_the_same_update_as_one(ray_local, tiny_model):  # noqa: F811
    tc, algo = _cfgs(mini_batches=2)
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
    ranks = _ranks(tiny_model, tc, algo, num_gpus=1)
    try:
        want = single.train_step(_batch())
        got = ray.get(ranks[0].train_step.remote(_batch()))
        assert got["actor/loss"] == pytest.approx(want["actor/loss"], rel=1e-4, abs=1e-6)
        assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
        assert_same_sync_weights(ranks[0], single, rtol=1e-4, atol=1e-5)
    finally:
        for r in ranks:
            ray.kill(r)
