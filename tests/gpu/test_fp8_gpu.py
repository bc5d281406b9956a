"""FP8 training on a GPU (trainer.precision=fp8, actors/trainer/fp8.py): the Trainer converts the linear layers to
torchao's Float8Linear on a GPU with FP8 tensor cores, trains a step whose loss and gradient norm are close to
bf16-autocast's on the same batch, keeps fp32 master weights, and its weights for the sync keep their names.

Marked `gpu`: needs CUDA with compute capability >= 8.9 (Ada, Hopper, Blackwell) and torchao;
run with `pytest -m gpu tests/gpu/test_fp8_gpu.py`.
"""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from actors.trainer import fp8
from actors.trainer.trainer import Trainer
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import random_batch

pytestmark = pytest.mark.gpu


def _trainer(folder, precision):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-3, "warmup_steps": 0, "micro_batch_size": 4, "precision": precision})
    return Trainer(str(folder), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


def test_fp8_trainer_step_on_the_gpu(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < fp8.MIN_CAPABILITY:
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability >= 8.9)")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, initializer_range=0.02)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    bf16, f8 = _trainer(tmp_path, "bf16-autocast"), _trainer(tmp_path, "fp8")
    assert fp8.count_fp8_linears(f8.model) == 14
    assert all(p.dtype == torch.float32 and p.is_cuda for p in f8.model.parameters())
    batch = random_batch(8, seed=1)
    ma, mb = bf16.train_step(batch), f8.train_step(batch)
    assert torch.isfinite(torch.tensor(mb["actor/loss"]))
    assert mb["actor/grad_norm"] == pytest.approx(ma["actor/grad_norm"], rel=0.2)
    assert [n for n, _ in f8.weights_for_sync("bfloat16")[0]] == [n for n, _ in bf16.weights_for_sync("bfloat16")[0]]
