"""The Trainer on a tiny random Llama (plain torch, no Ray): updates, mini-batch ratios, checkpoints."""
from __future__ import annotations


import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from tests.unit.trainer_helpers import random_batch, save_tiny_llama
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from orchestrator.weight_sync import group_checksums


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


def _batch(n=8, seed=0):
    return random_batch(n, seed)


def _trainer(tiny, **over):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32", **over})
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


def test_later_mini_batches_see_the_ratio_to_the_sampling_policy(tiny):
    # old logprobs come from the weights before the step's first update, so after mini-batch 1
    # moved the policy, mini-batch 2's ratios differ from 1 (and can clip); with one mini-batch they are 1
    m = _trainer(tiny, mini_batches=2).train_step(_batch())
    assert m["actor/ratio_mean"] != pytest.approx(1.0, abs=1e-6)
    one = _trainer(tiny, mini_batches=1).train_step(_batch())
    assert one["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and one["actor/clip_frac"] == 0.0


def test_update_is_invariant_to_micro_batch_size(tiny):
    a, b = _trainer(tiny, micro_batch_size=1), _trainer(tiny, micro_batch_size=8)
    ma, mb = a.train_step(_batch()), b.train_step(_batch())
    assert ma["actor/loss"] == pytest.approx(mb["actor/loss"], abs=1e-6)
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-5)


def test_checkpoint_round_trip_restores_weights_optimizer_and_schedule(tiny, tmp_path):
    a = _trainer(tiny, warmup_steps=2, total_steps=10)
    a.train_step(_batch(seed=1))
    a.save_checkpoint(str(tmp_path / "ck"), {"step": 1})
    b = _trainer(tiny, warmup_steps=2, total_steps=10)
    assert b.load_checkpoint(str(tmp_path / "ck")) == {"step": 1}
    assert b.step == 1 and b.scheduler.get_last_lr() == a.scheduler.get_last_lr()
    ma, mb = a.train_step(_batch(seed=2)), b.train_step(_batch(seed=2))
    assert ma["actor/loss"] == pytest.approx(mb["actor/loss"], abs=1e-6)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_weights_for_sync_leave_out_the_tied_head_but_checksum_it(tiny):
    named, meta = _trainer(tiny).weights_for_sync("float32")
    names = [n for n, _ in named]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    embed = dict(named)["model.embed_tokens.weight"]
    assert meta["groups"]["lm_head"] == group_checksums([("lm_head.weight", embed)])["lm_head"]
    assert meta["bytes"] == sum(t.numel() * 4 for _, t in named)
