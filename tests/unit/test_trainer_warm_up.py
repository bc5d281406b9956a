"""The trainer's warm-up (trainer.warm_up, actors/trainer/warmup.py) changes nothing a run computes: a warmed-up
trainer takes the same steps bit for bit as one that was not, and leaves the weights, optimizer, schedule, step
count and RNG as they were; its micro-batch is the largest the config allows, collated as a step collates it and
run through the step's own forward (autocast, packing, the shared-prompt forward); a trainer on a GPU skips it;
a micro-batch that does not fit names its shape."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer import warmup
from actors.trainer.trainer import Trainer
from actors.trainer.warmup import touch_optimizer_state, warm_up_sequences
from orchestrator.config import load_config
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from orchestrator.memory.preflight import longest_sequence
from tests.unit.trainer_helpers import random_batch, save_tiny_llama

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(autouse=True)
def cpu_trainers(monkeypatch):
    """The warm-up is the CPU trainer's (a GPU trainer skips it: `test_a_trainer_on_a_gpu_skips_it`): the trainers
    here stay on the CPU on a host with CUDA too (Trainer puts its model on CUDA when CUDA is available)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _trainer(tiny, **over) -> Trainer:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 1, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32",
               "weight_decay": 0.1, **over})
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


@pytest.mark.parametrize("over", [{"packing": False}, {"packing": True}, {"precision": "bf16-autocast"},
                                  {"shared_prefix": False}])
def test_a_warmed_up_trainer_trains_bit_for_bit_like_a_cold_one(tiny, over):
    over = {"micro_batch_tokens": 24, **over}
    cold, warm = _trainer(tiny, **over), _trainer(tiny, **over)
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    weights = {k: v.clone() for k, v in warm.model.state_dict().items()}
    lr = warm.scheduler.get_last_lr()
    out = warm.warm_up(6, 8)
    assert out["trainer/warm_up_s"] > 0
    assert all(torch.equal(v, weights[k]) for k, v in warm.model.state_dict().items())  # weights untouched
    assert all(p.grad is None for p in warm.model.parameters())
    state = [v for st in warm.optimizer.state.values() for v in st.values()]  # kept where it was touched, as new
    trained = [p for g in warm.optimizer.param_groups for p in g["params"]]
    assert len(warm.optimizer.state) == len(trained) and all(not v.any() for v in state)
    assert warm.step == 0 and warm.scheduler.get_last_lr() == lr and torch.equal(torch.get_rng_state(), rng)
    for seed in (0, 1):
        torch.manual_seed(seed)
        a = cold.train_step(random_batch(8, seed))
        torch.manual_seed(seed)
        b = warm.train_step(random_batch(8, seed))
        assert a["actor/loss"] == b["actor/loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    assert all(torch.equal(v, cold.model.state_dict()[k]) for k, v in warm.model.state_dict().items())
    for p, q in zip(cold.model.parameters(), warm.model.parameters()):
        sa, sb = cold.optimizer.state[p], warm.optimizer.state[q]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("over, seen_shapes", [
    ({"packing": False, "shared_prefix": False}, [((3, 14), [6] * 3, [8] * 3, 3)]),
    ({"packing": True}, [((1, 30), [6, 6, 1], [8, 8, 1], 3)]),  # 2 x 14 tokens, then 2 to fill the row
    ({"packing": False, "shared_prefix": True}, [((3, 14), [6] * 3, [8] * 3, 2)]),  # groups of 2: a + a + b
])
def test_the_micro_batch_goes_through_the_steps_own_forward(tiny, monkeypatch, over, seen_shapes):
    seen = []

    def spy(trainer, mb, prompts, responses, router=None):
        torch.rand(1)  # draws from the CPU RNG as dropout would: the warm-up must give the state back
        seen.append((tuple(mb.input_ids.shape), [len(p) for p in prompts], [len(r) for r in responses],
                     len({tuple(p) for p in prompts})))
        return real(trainer, mb, prompts, responses, router)

    real = warmup.policy_forward
    monkeypatch.setattr(warmup, "policy_forward", spy)
    trainer = _trainer(tiny, micro_batch_tokens=30, **over)
    rng = torch.get_rng_state()
    trainer.warm_up(6, 8, group_size=2)
    assert seen == seen_shapes * 2  # twice (gradient accumulation); shared_prefix: a GRPO group of 2 shares its prompt
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_micro_batch_that_does_not_fit_names_its_shape(tiny, monkeypatch):
    def raises(message):
        def forward(*args):
            raise RuntimeError(message)
        return forward

    no_memory = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"
    monkeypatch.setattr(warmup, "policy_forward", raises(no_memory))
    with pytest.raises(torch.OutOfMemoryError, match="3 sequences of 6 \\+ 8 tokens, .* does not fit: .*DefaultCPU"):
        _trainer(tiny).warm_up(6, 8)
    with pytest.raises(torch.OutOfMemoryError, match="a packed row of 30 tokens \\(3 sequences\\)"):
        _trainer(tiny, packing=True, micro_batch_tokens=30).warm_up(6, 8)
    other = "The tensor has a non-zero number of elements, but its data is not allocated yet"
    monkeypatch.setattr(warmup, "policy_forward", raises(other))
    with pytest.raises(RuntimeError, match="^The tensor has") as err:  # other errors pass through unchanged
        _trainer(tiny).warm_up(6, 8)
    assert not isinstance(err.value, torch.OutOfMemoryError)


def test_a_trainer_on_a_gpu_skips_it():
    on_device = SimpleNamespace(model=torch.nn.Linear(2, 2, device="meta"))  # any device but the CPU
    assert warmup.warm_up(on_device, 6, 8) == {"trainer/warm_up_s": 0.0}


@pytest.mark.parametrize("cls, kept", [(torch.optim.AdamW, True), (torch.optim.Adam, True), (torch.optim.SGD, False)])
def test_touch_optimizer_state_leaves_the_optimizer_as_new(cls, kept):
    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        extra = {"momentum": 0.9, "dampening": 0.5} if cls is torch.optim.SGD else {}
        return model, cls(model.parameters(), lr=0.5, weight_decay=0.3, **extra)

    model, opt = model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    model.weight.grad = torch.ones_like(model.weight)  # the bias has no gradient: it gets its state too
    touch_optimizer_state(opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert opt.param_groups[0]["lr"] == 0.5 and all(p.grad is None for p in model.parameters())
    if kept:  # Adam's lazily made state is zeros and step 0: kept, zeroed
        assert len(opt.state) == 2 and all(not v.any() for st in opt.state.values() for v in st.values())
    else:  # SGD's momentum buffer starts as the first gradient, not as zeros: emptied
        assert not opt.state
    cold_model, cold = model_and_optimizer()
    for m, o in ((model, opt), (cold_model, cold)):  # the next two steps equal a new optimizer's, bit for bit
        for x in (torch.ones(2, 4), torch.arange(8.0).view(2, 4)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), cold_model.parameters()))


def test_the_shape_is_the_largest_micro_batch_the_config_allows():
    assert warm_up_sequences(8, False, 4096, 48, 256) == [(48, 256)] * 8
    assert warm_up_sequences(8, True, 4096, 48, 256) == [(48, 256)] * 13 + [(48, 96)]  # 13 x 304 + 144 = 4096
    assert warm_up_sequences(8, True, 256, 48, 256) == [(48, 256)]  # longer than the row: alone in it
    assert warm_up_sequences(2, True, 7, 2, 1) == [(2, 1)] * 2  # 1 token left: no sequence
    with pytest.raises(ValueError, match="warm-up micro-batch"):
        warm_up_sequences(0, False, 4096, 48, 256)
    with pytest.raises(ValueError, match="prompt_len=0"):
        warmup.warm_up(SimpleNamespace(), 0, 8)
    with pytest.raises(ValueError, match="group_size=0"):
        warmup.warm_up(SimpleNamespace(), 6, 8, group_size=0)
    cfg = load_config(CONFIGS / "grpo_arith_cpu.yaml")
    assert longest_sequence(cfg, 41) == (41, cfg.rollout.max_new_tokens)  # the data's longest prompt
    assert longest_sequence(cfg) == (cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens)
    multi = load_config(CONFIGS / "grpo_frozenlake_cpu.yaml")
    assert longest_sequence(multi, 100) == (1, multi.env.max_tokens - 1)  # the env's first observation: unknown


def test_resume_after_the_warm_up_takes_the_checkpoints_optimizer_state(tiny, tmp_path):
    trained = _trainer(tiny)
    trained.train_step(random_batch(8, 0))
    folder = trained.save_checkpoint(str(tmp_path / "ckpt"), {"step": 1})
    resumed = _trainer(tiny)
    resumed.warm_up(6, 8)  # a run warms up while the engines start, then restores its checkpoint
    resumed.load_checkpoint(folder)
    for p, q in zip(trained.model.parameters(), resumed.model.parameters()):
        sa, sb = trained.optimizer.state[p], resumed.optimizer.state[q]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa) and float(sb["step"]) == 1.0
    torch.manual_seed(3)
    a = trained.train_step(random_batch(8, 1))
    torch.manual_seed(3)
    b = resumed.train_step(random_batch(8, 1))
    assert a["actor/loss"] == b["actor/loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
