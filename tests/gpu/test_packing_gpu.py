"""Packed rows on a GPU with FlashAttention-2's varlen kernel (trainer.attn_implementation, actors/model/attention.py):
each sequence of a packed row gets the same logprobs as alone under SDPA (case C11), and the trainer picks
flash_attention_2 by itself for packed bf16 rows.

Marked `gpu`: needs CUDA and the flash_attn package; run with `pytest -m gpu tests/gpu/test_packing_gpu.py`.
"""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from actors.model.attention import attn_implementation_for, flash_attn_available
from actors.model.forward import collate, collate_packed, forward_logprobs, response_values
from orchestrator.config.schema import TrainerConfig

pytestmark = pytest.mark.gpu
V = 97


def _tiny(attn: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3, attn_implementation=attn)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()


def test_flash_varlen_packed_logprobs_equal_each_sequence_alone():
    if not (torch.cuda.is_available() and flash_attn_available()):
        pytest.skip("needs CUDA and flash_attn (pip install flash-attn --no-build-isolation)")
    flash, sdpa = _tiny("flash_attention_2"), _tiny("sdpa")
    sdpa.load_state_dict(flash.state_dict())
    prompts, responses = [[11], [21], [5, 6, 7]], [[12, 13, 14], [22, 23], [8, 9, 10, 11, 12]]
    with torch.no_grad():  # forward_logprobs moves the micro-batch to the model's device
        mb = collate_packed(prompts, responses)
        packed = response_values(forward_logprobs(flash, mb, temperature=0.7), mb)
        for p, r, got in zip(prompts, responses, packed):
            alone = collate([p], [r])
            want = response_values(forward_logprobs(sdpa, alone, temperature=0.7), alone)[0]
            assert got == pytest.approx(want, abs=3e-2)  # bf16 kernels: flash varlen vs SDPA


def test_trainer_config_picks_flash_for_packed_bf16_rows():
    if not (torch.cuda.is_available() and flash_attn_available()):
        pytest.skip("needs CUDA and flash_attn")
    cfg = TrainerConfig(packing=True, precision="bf16-autocast")
    assert attn_implementation_for(cfg, packing=True) == "flash_attention_2"
    assert attn_implementation_for(TrainerConfig(packing=False, precision="bf16-autocast"), packing=False) is None
