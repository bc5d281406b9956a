"""Context parallelism through the real trainer (trainer.context_parallel_size = c, actors/trainer/sharded.py +
context_parallel.py) on Ray, CPU, gloo: D = 2 ranks with c = 2 (one sequence split over both ranks, FSDP2 over
both), and D = 4 ranks with c = 2 (context parallelism inside 2 data-parallel groups).

- One update of the two ranks equals one update of a single trainer on the same global batch: packed rows of
  24 tokens (sequences straddle the zig-zag chunk cuts), two mini-batches (the old-logprob pass split too), every
  parameter after the AdamW step, and the loss / ratio / mismatch metrics; the ranks' `logprobs` equal the single
  trainer's.
- The reference split over 2 ranks (actors/reference_cp.py) gives one reference's logprobs, padded and packed.
- A GRPO run with trainer.num_workers=2, trainer.context_parallel_size=2 and KL on (`rl-orch run`'s config path:
  2 trainer ranks, 2 reference ranks) trains and syncs the engines (verified checksums); its step-1 KL is 0.
"""
from __future__ import annotations

import random

import pytest
import ray

from actors.trainer.trainer import Trainer
from orchestrator.controller import GRPOController
from tests.integration.test_fsdp import _batch, _cfgs, _grpo_cfg, _ranks, assert_same_sync_weights

pytestmark = pytest.mark.integration


# d = 2: one sequence split over both ranks; d = 4 (issue 37): context parallelism composed with data parallelism,
# 2 data-parallel groups of c = 2 ranks each (4 gloo ranks), FSDP2 over all 4.
@pytest.mark.parametrize("d", [2, 4])
def test_context_parallel_ranks_give_the_same_update_as_one(ray_local, tiny_model, tmp_path, d):
    over = dict(mini_batches=2, packing=True, micro_batch_tokens=24)
    tc, algo = _cfgs(**over)
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
    tc_cp, _ = _cfgs(**over, context_parallel_size=2, num_workers=d)
    ranks = _ranks(tiny_model, tc_cp, algo, d=d)
    try:
        batch = _batch()
        before = single.logprobs(batch.prompt_ids, batch.response_ids)
        got_lp = ray.get(ranks[0].logprobs.remote(batch.prompt_ids, batch.response_ids))
        assert max(abs(a - b) for x, y in zip(before, got_lp) for a, b in zip(x, y)) < 1e-5
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        # a rank's micro-batches: its data-parallel group's share (d / c = 1 or 2 groups) of the single trainer's
        assert got["actor/micro_batches"] * (d // 2) == want["actor/micro_batches"] > 1
        for key in ("actor/loss", "actor/grad_norm", "actor/ratio_mean", "actor/clip_frac", "rollout/mismatch_kl_k1",
                    "rollout/mismatch_ratio_max"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        # atol 1e-5: AdamW's first step lr * m / (sqrt(v) + eps) amplifies float-order noise where |g| ~ eps
        # (test_fsdp; measured here: 1 of 6.3M weights, an embedding row, 2.0e-6 apart); a wrong update
        # would be off by ~lr = 1e-3
        assert_same_sync_weights(ranks[0], single, rtol=1e-5, atol=1e-5)
        assert ray.get([r.get_step.remote() for r in ranks]) == [2] * d and single.step == 2
    finally:
        for r in ranks:
            ray.kill(r)


def test_the_context_parallel_reference_equals_one_reference(ray_local, tiny_model):
    """Padded micro-batches of 2 and packed rows of 24 tokens: two groups of 2 ranks, started together."""
    from actors.reference import Reference
    from actors.reference_cp import ContextParallelReferenceActor

    groups = {}
    for micro_batch_tokens in (None, 24):
        name = f"test-ref-{random.getrandbits(40):x}"
        groups[micro_batch_tokens] = [ContextParallelReferenceActor.options(num_cpus=0.5).remote(
            str(tiny_model), 1.0, 2, micro_batch_tokens=micro_batch_tokens, rank=r, world_size=2, group_name=name,
            timeout_s=120.0) for r in range(2)]
    try:
        ray.get([r.ready.remote() for ranks in groups.values() for r in ranks])
        batch = _batch()
        for micro_batch_tokens, ranks in groups.items():
            ray.get(ranks[0].set_peers.remote(ranks[1:]))
            want = Reference(str(tiny_model), 1.0, 2, micro_batch_tokens=micro_batch_tokens,
                             shared_prefix=False).logprobs(batch.prompt_ids, batch.response_ids)
            got = ray.get(ranks[0].logprobs.remote(batch.prompt_ids, batch.response_ids))
            assert [len(x) for x in got] == [len(x) for x in want] == [len(r) for r in batch.response_ids]
            assert max(abs(a - b) for x, y in zip(want, got) for a, b in zip(x, y)) < 1e-5, micro_batch_tokens
    finally:
        for r in [r for ranks in groups.values() for r in ranks]:
            ray.kill(r)


def test_grpo_run_with_context_parallel_trains_and_syncs(ray_local, tiny_model, tmp_path):
    # KL on: the reference runs as 2 context-parallel ranks too (actors/reference_cp.py)
    controller = GRPOController(_grpo_cfg(tiny_model, tmp_path, "trainer.context_parallel_size=2",
                                          "trainer.packing=true", "algo.kl_coef=0.01",
                                          "placement.reference_per_worker=0.25"))
    try:
        result = controller.run()
        assert len(controller.actors.reference_ranks) == 2
        from orchestrator.weight_sync import compare_checksums

        trainer, worker = controller.actors.trainer, controller.actors.rollout[0]
        _, meta = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        engine = ray.get(worker.checksums.remote())
        compare_checksums(meta["groups"], engine["groups"], where="rollout worker 0")
    finally:
        controller.shutdown()
    assert [r["step"] for r in result.rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in result.rows)
    assert abs(result.rows[0]["actor/kl"]) < 1e-6  # step 1: the policy is the reference, both split alike
