"""The trainer's warm-up (trainer.warm_up, actors/trainer/warmup.py) changes nothing a run computes: a warmed-up
trainer takes the same steps bit for bit as one that was not, and leaves the weights, optimizer, schedule, step
count and RNG as they were; its shape is the largest micro-batch the config allows."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from actors.trainer.warmup import touch_optimizer_state, warm_up_shape
from orchestrator.config import load_config
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from orchestrator.job import warm_up_len
from tests.unit.trainer_helpers import random_batch, save_tiny_llama

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


def _trainer(tiny, **over) -> Trainer:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 1, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32",
               "weight_decay": 0.1, **over})
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


@pytest.mark.parametrize("packing", [False, True])
def test_a_warmed_up_trainer_trains_bit_for_bit_like_a_cold_one(tiny, packing):
    over = {"packing": packing, "micro_batch_tokens": 24}
    cold, warm = _trainer(tiny, **over), _trainer(tiny, **over)
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    weights = {k: v.clone() for k, v in warm.model.state_dict().items()}
    lr = warm.scheduler.get_last_lr()
    out = warm.warm_up(20)
    assert out["trainer/warm_up_s"] > 0
    assert all(torch.equal(v, weights[k]) for k, v in warm.model.state_dict().items())  # weights untouched
    assert not warm.optimizer.state and all(p.grad is None for p in warm.model.parameters())
    assert warm.step == 0 and warm.scheduler.get_last_lr() == lr and torch.equal(torch.get_rng_state(), rng)
    for seed in (0, 1):
        a, b = cold.train_step(random_batch(8, seed)), warm.train_step(random_batch(8, seed))
        assert a["actor/loss"] == b["actor/loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    assert all(torch.equal(v, cold.model.state_dict()[k]) for k, v in warm.model.state_dict().items())
    for p, q in zip(cold.model.parameters(), warm.model.parameters()):
        sa, sb = cold.optimizer.state[p], warm.optimizer.state[q]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_touch_optimizer_state_leaves_adamw_as_new():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.3)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(2, 4)).sum().backward()
    touch_optimizer_state(opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert not opt.state and opt.param_groups[0]["lr"] == 0.5 and all(p.grad is None for p in model.parameters())


def test_the_shape_is_the_largest_micro_batch_the_config_allows():
    assert warm_up_shape(8, 304, packing=False, micro_batch_tokens=4096) == (8, 304)
    assert warm_up_shape(8, 304, packing=True, micro_batch_tokens=4096) == (1, 4096)
    with pytest.raises(ValueError, match="warm-up micro-batch"):
        warm_up_shape(0, 304, packing=False, micro_batch_tokens=4096)
    cfg = load_config(CONFIGS / "grpo_arith_cpu.yaml")
    assert warm_up_len(cfg) == cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    multi = load_config(CONFIGS / "grpo_frozenlake_cpu.yaml")
    assert warm_up_len(multi) == multi.rollout.max_model_len  # multi-turn: observations too, up to the context
