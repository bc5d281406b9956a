"""Context parallelism on GPUs with NCCL (trainer.context_parallel_size = 2, actors/model/context_parallel.py):
D = 2 ranks with c = 2 give the same logprobs and update as one trainer on the same packed batch, in fp32 (the
ring's send/recv and the all-gather of logprobs over NCCL, the ring's positions on CUDA).

Marked `gpu`: skipped without CUDA; needs 2 GPUs (NCCL runs one rank per device). Run on a GPU machine with
`pytest -m gpu tests/gpu/test_context_parallel_gpu.py`.
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
def test_two_context_parallel_nccl_ranks_give_the_same_update_as_one(ray_local, tiny_model):  # noqa: F811
    over = dict(mini_batches=2, packing=True, micro_batch_tokens=24, precision="fp32")
    tc, algo = _cfgs(**over)
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
    tc_cp, _ = _cfgs(**over, context_parallel_size=2)
    ranks = _ranks(tiny_model, tc_cp, algo, num_gpus=1)
    try:
        batch = _batch()
        want_lp = single.logprobs(batch.prompt_ids, batch.response_ids)
        got_lp = ray.get(ranks[0].logprobs.remote(batch.prompt_ids, batch.response_ids))
        assert max(abs(a - b) for x, y in zip(want_lp, got_lp) for a, b in zip(x, y)) < 1e-4
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        assert got["actor/loss"] == pytest.approx(want["actor/loss"], rel=1e-4, abs=1e-6)
        assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
        assert_same_sync_weights(ranks[0], single, rtol=1e-4, atol=1e-5)
    finally:
        for r in ranks:
            ray.kill(r)
