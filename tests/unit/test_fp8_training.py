"""trainer.precision=fp8 (actors/trainer/fp8.py, torchao's float8 training): which layers run in FP8, that their
matmuls are really rounded to e4m3, that master weights, optimizer states, the sync's state dict and checkpoints
stay fp32 and unchanged in names, that the Trainer trains with it, and the refusals (old GPU, LoRA, no torchao)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from actors.trainer import fp8
from actors.trainer.trainer import Trainer
from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import random_batch, save_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


GPU = ["trainer.precision=fp8", "placement.resource=GPU"]  # load-time checks only: nothing starts


def _trainer(tiny, precision):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-2, "warmup_steps": 0, "micro_batch_size": 4, "num_threads": 1, "precision": precision})
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    """Per-tensor dynamic scaling to e4m3's largest value (448) and back: what Float8Linear's casts compute."""
    scale = 448.0 / t.abs().max()
    return (t * scale).to(torch.float8_e4m3fn).float() / scale


def test_eligible_layers():
    assert fp8.eligible(torch.nn.Linear(64, 32), "model.layers.0.mlp.up_proj")
    assert not fp8.eligible(torch.nn.Linear(64, 32), "lm_head")  # the logits stay in high precision
    assert not fp8.eligible(torch.nn.Linear(64, 30), "model.layers.0.mlp.up_proj")  # not 16-aligned
    assert not fp8.eligible(torch.nn.Embedding(64, 32), "model.embed_tokens")


def test_apply_fp8_converts_the_linears_and_their_matmuls_are_e4m3(tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    names = sorted(model.state_dict())
    fp8.apply_fp8(model)
    # 2 layers x (q, k, v, o, gate, up, down); the tied head is an nn.Linear named lm_head: skipped
    assert fp8.count_fp8_linears(model) == 14 and type(model.lm_head) is torch.nn.Linear
    assert sorted(model.state_dict()) == names  # the weight sync and checkpoints see the same tensors
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    # token counts that are not multiples of 16 (the weight gradient's inner dimension) are padded: the FP8 GEMM of
    # an H200 refused 4 x 9 tokens without it
    assert all(m.config.pad_inner_dim for m in model.modules() if type(m).__name__ == "Float8Linear")
    layer = model.model.layers[0].mlp.up_proj
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    out = layer(x)
    assert torch.allclose(out, _e4m3(x) @ _e4m3(layer.weight).t(), atol=1e-5)
    assert not torch.allclose(out, x @ layer.weight.t(), atol=1e-2)  # FP8 really rounds


def test_the_trainer_trains_in_fp8_with_fp32_master_weights_and_state(tiny, tmp_path):
    a, b = _trainer(tiny, "fp32"), _trainer(tiny, "fp8")
    assert fp8.count_fp8_linears(b.model) == 14
    batch = random_batch(8, seed=1)
    before = {n: p.detach().clone() for n, p in b.model.named_parameters()}
    ma, mb = a.train_step(batch), b.train_step(batch)
    assert torch.isfinite(torch.tensor(mb["actor/loss"])) and mb["actor/grad_norm"] > 0
    assert mb["actor/loss"] != ma["actor/loss"]  # FP8 rounding changed the logprobs
    assert mb["actor/grad_norm"] == pytest.approx(ma["actor/grad_norm"], rel=0.3)  # but the same update, roughly
    assert all(not torch.equal(p, before[n]) for n, p in b.model.named_parameters() if p.requires_grad)
    state = b.optimizer.state[next(iter(b.model.parameters()))]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    named, _ = b.weights_for_sync("float32")
    assert [n for n, _ in named] == [n for n, _ in a.weights_for_sync("float32")[0]]
    b.save_checkpoint(str(tmp_path / "ck"), {"step": 1})
    c = _trainer(tiny, "fp8")
    c.load_checkpoint(str(tmp_path / "ck"))
    assert fp8.count_fp8_linears(c.model) == 14
    for (n, p), q in zip(b.model.named_parameters(), c.model.parameters()):
        assert torch.equal(p, q), n


def test_an_old_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    with pytest.raises(fp8.FP8Unsupported, match=r"trainer.precision=fp8: NVIDIA A100 \(compute capability 8.0\)"):
        fp8.check_fp8_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"trainer.precision=fp8: this GPU \(NVIDIA A100, compute capability 8.0\)"):
        load_config("configs/grpo_arith_cpu.yaml", GPU)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    fp8.check_fp8_device("cuda:0")  # Hopper passes
    assert load_config("configs/grpo_arith_cpu.yaml", GPU).trainer.precision == "fp8"


def test_config_refusals(monkeypatch):
    with pytest.raises(ConfigError, match="trainer.precision=fp8 with placement.resource=CPU: FP8 training needs GPUs"):
        load_config("configs/grpo_arith_cpu.yaml", ["trainer.precision=fp8"])  # the CPU runs FP8 only in tests
    with pytest.raises(ConfigError, match="trainer.precision=fp8 with trainer.lora.rank=8"):
        load_config("configs/grpo_arith_cpu.yaml", [*GPU, "trainer.lora.rank=8"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs torchao's float8 training: pip install 'rl-orchestrator\[fp8\]'"):
        load_config("configs/grpo_arith_cpu.yaml", GPU)
    # the memory planner plans FP8 without torchao or a GPU
    assert load_config("configs/grpo_arith_cpu.yaml", ["trainer.precision=fp8"], plan_only=True)
