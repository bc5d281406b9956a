"""FSDP2 trainer ranks (trainer.num_workers = 2, gloo, CPU) with sequence packing and with LoRA.

- Packing: the two ranks' shards pack into different row counts (2 vs 4 here); the rank with fewer
  rows runs empty micro-batches so that FSDP's collectives line up, and the update equals a single
  packed trainer's on the same global batch (every parameter, fp32).
- LoRA: after a step the two ranks' adapters (written by their checkpoint) equal a single trainer's,
  the merged weights they sync equal the single trainer's merged weights, and checkpoints move
  between D = 2 and D = 1 in both directions.
- A GRPO run with both on (D = 2) syncs the merged policy: the engine's checksums and logprobs match.

Run: .venv/bin/python -m pytest -q tests/integration/test_fsdp_packing_lora.py
"""
from __future__ import annotations

import random

import pytest
import ray
import torch
from safetensors.torch import load_file

from actors.trainer.sharded import SHARDED_DIR
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.algo.packing import pack_first_fit_decreasing
from orchestrator.controller import GRPOController
from orchestrator.rollout import PromptRequest
from orchestrator.weight_sync import compare_checksums
from tests.integration.test_fsdp import _batch, _cfgs, _grpo_cfg, _ranks

pytestmark = pytest.mark.integration
BUDGET = 12  # trainer.micro_batch_tokens of the packing test
# D = 1 and D = 2 sum gradients in different float orders (packed rows group the samples differently;
# FSDP reduce-scatters), ~1e-7 relative: the gradient norms agree to 8e-7. AdamW's first step moves a
# weight by lr * g / (|g| + eps); where |g| is near eps = 1e-8 that fraction of lr is order-sensitive
# (measured: packing, lr 1e-3: 2 of ~600k elements off by up to 9.5e-7; LoRA, lr 1e-2: 1 adapter
# element off by 1.1e-7). An empty micro-batch that added anything to the gradients would move weights
# by a sizeable fraction of lr (1e-3, 1e-2), far above this.
ADAM_ATOL = 2e-6


def _uneven_batch(n: int = 8, seed: int = 3, long_rank: int = 1) -> TrainBatch:
    """Samples of rank `long_rank`'s shard (index % 2 == long_rank) of 10-11 tokens, the others of 3-4."""
    rng = random.Random(seed)
    long = [i % 2 == long_rank for i in range(n)]
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(5, 6) if long[i] else 2)] for i in range(n)]
    responses = [[rng.randrange(3, 500) for _ in range(5 if long[i] else rng.randint(1, 2))] for i in range(n)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses],
                                               [rng.choice([-1.0, 0.5, 1.0]) for _ in range(n)], ref_logprobs=None)


def _rows(batch: TrainBatch, rank: int, d: int = 2) -> int:
    lengths = [len(p) + len(r) for i, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids))
               if i % d == rank]
    return len(pack_first_fit_decreasing(lengths, BUDGET))


def _assert_close_and_moved(got: list, want: list, initial: dict, atol: float = 2e-7) -> int:
    assert [n for n, _ in got] == [n for n, _ in want]
    moved = 0
    for (name, a), (_, b) in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
        moved += not torch.equal(b, initial[name])
    return moved


def test_packed_ranks_with_different_row_counts_give_the_single_trainers_update(ray_local, tiny_model):
    tc, algo = _cfgs(packing=True, micro_batch_tokens=BUDGET)
    batch = _uneven_batch()
    assert (_rows(batch, 0), _rows(batch, 1)) == (2, 4)  # rank 0 must run 2 empty micro-batches
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
    initial = {k: t.clone() for k, t in single.weights_for_sync("float32")[0]}  # the export aliases parameters
    ranks = _ranks(tiny_model, tc, algo)
    try:
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        for key in ("actor/loss", "actor/grad_norm", "actor/ratio_mean", "actor/clip_frac"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        assert got["actor/micro_batches"] == 2.0 and want["actor/micro_batches"] == 6.0  # rank 0's rows; D = 1's
        named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        ours, _ = single.weights_for_sync("float32")
        assert _assert_close_and_moved(named, ours, initial, ADAM_ATOL) == len(ours)
        # a second step where rank 1 has the fewer rows
        assert ray.get(ranks[1].get_step.remote()) == 1
        batch = _uneven_batch(seed=4, long_rank=0)
        assert (_rows(batch, 0), _rows(batch, 1)) == (4, 2)
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        assert got["actor/loss"] == pytest.approx(want["actor/loss"], rel=1e-5, abs=1e-7)
        named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        _assert_close_and_moved(named, single.weights_for_sync("float32")[0], initial, ADAM_ATOL)
    finally:
        for r in ranks:
            ray.kill(r)


def _lora_cfgs():
    tc, algo = _cfgs(lr=1e-2)
    tc.lora.update({"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]})
    return tc, algo


def _adapter(folder) -> dict:
    return load_file(str(folder / "policy_adapter" / "adapter_model.safetensors"))


def test_lora_ranks_train_the_single_trainers_adapter_and_sync_its_merged_weights(ray_local, tiny_model, tmp_path):
    tc, algo = _lora_cfgs()
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
    initial = {k: t.clone() for k, t in single.weights_for_sync("float32")[0]}  # the export aliases parameters
    ranks = _ranks(tiny_model, tc, algo)
    try:
        batch = _batch()
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
        # the adapters after the step (each side's checkpoint writes them in peft format)
        single.save_checkpoint(str(tmp_path / "d1"), {"step": 1})
        ray.get(ranks[0].save_checkpoint.remote(str(tmp_path / "d2"), {"step": 1}))
        a1, a2 = _adapter(tmp_path / "d1"), _adapter(tmp_path / "d2")
        assert a1.keys() == a2.keys() and len(a1) == 2 * 3 * 2  # A and B of 3 projections in 2 layers
        for k in a1:
            torch.testing.assert_close(a2[k], a1[k], rtol=1e-5, atol=ADAM_ATOL, msg=lambda m, n=k: f"{n}: {m}")
        assert all(a1[k].abs().max() > 0 for k in a1 if "lora_B" in k)  # B starts at 0: it moved
        # the merged weights synced from rank 0 equal the single trainer's merged weights
        named, meta = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        ours, ours_meta = single.weights_for_sync("float32")
        moved = _assert_close_and_moved(named, ours, initial, ADAM_ATOL)
        assert moved == 2 * 3 and all(n.split(".")[-2] in ("q_proj", "v_proj", "down_proj")
                                      for n, t in named if not torch.equal(t, initial[n]))
        assert meta["bytes"] == ours_meta["bytes"]
        assert ray.get(ranks[0].sync_size.remote("float32")) == single.sync_size("float32")
        # checkpoints: D = 2 -> D = 2 (after one more step, the load restores the saved merged weights),
        # D = 1 -> D = 2 (the single trainer's adapter) and D = 2 -> D = 1
        ray.get(ranks[0].train_step.remote(_batch(seed=1)))
        ray.get(ranks[0].load_checkpoint.remote(str(tmp_path / "d2")))
        back, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(back, named))
        ray.get(ranks[0].load_checkpoint.remote(str(tmp_path / "d1")))
        back, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(back, ours))
        resumed = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
        assert resumed.load_checkpoint(str(tmp_path / "d2"))["step"] == 1 and resumed.step == 1
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(resumed.weights_for_sync("float32")[0], named))
    finally:
        for r in ranks:
            ray.kill(r)


def test_grpo_with_two_ranks_packing_and_lora_syncs_the_merged_policy(ray_local, tiny_model, tmp_path):
    cfg = _grpo_cfg(tiny_model, tmp_path, "trainer.packing=true", "trainer.micro_batch_tokens=268",
                    "trainer.lora.rank=8", "trainer.lr=1e-2", "checkpoint.every_steps=2")
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        trainer, worker = controller.actors.trainer, controller.actors.rollout[0]
        named, meta = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        engine = ray.get(worker.checksums.remote())
        assert engine["version"] == 2
        compare_checksums(meta["groups"], engine["groups"], where="rollout worker 0")  # the merged weights
        trajs, _ = ray.get(worker.generate.remote([PromptRequest(group_id=0, prompt_ids=[1, 2, 3, 4, 5], answer="")]))
        ours = ray.get(trainer.logprobs.remote([t.prompt_ids for t in trajs], [t.response_ids for t in trajs]))
        assert all(max(abs(a - b) for a, b in zip(t.logprobs, lp)) < 2e-3 for t, lp in zip(trajs, ours))
    finally:
        controller.shutdown()
    assert [r["step"] for r in result.rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in result.rows)
    initial = load_file(str(tiny_model / "model.safetensors"))
    changed = {k for k, v in dict(named).items() if not torch.equal(v, initial[k])}
    assert changed and all(k.rsplit(".", 2)[-2].endswith("_proj") for k in changed)  # only adapted projections
    ckpt = tmp_path / "ckpt" / "step_000002"
    assert (ckpt / "policy_adapter" / "adapter_model.safetensors").is_file() and (ckpt / SHARDED_DIR).is_dir()
