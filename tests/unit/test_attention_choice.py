"""actors/model/attention.py: which attention kernel the trainer and reference load (trainer.attn_implementation)."""
from __future__ import annotations

import pytest

from actors.model.attention import load_kwargs, resolve_attn_implementation
from orchestrator.config import ConfigError, load_config

GPU = dict(on_cuda=True, packing=True, precision="bf16-autocast", flash_available=True)


def test_auto_picks_flash_varlen_only_for_packed_bf16_rows_on_gpus_with_flash_attn() -> None:
    assert resolve_attn_implementation("auto", **GPU) == "flash_attention_2"
    for change in ({"on_cuda": False}, {"packing": False}, {"precision": "fp32"}, {"flash_available": False}):
        assert resolve_attn_implementation("auto", **{**GPU, **change}) is None, change  # transformers' default


def test_explicit_choices_are_kept() -> None:
    for impl in ("sdpa", "eager"):
        assert resolve_attn_implementation(impl, on_cuda=False, packing=False, precision="fp32",
                                           flash_available=False) == impl
    assert resolve_attn_implementation("flash_attention_2", **GPU) == "flash_attention_2"


@pytest.mark.parametrize("change, fragment", [
    ({"on_cuda": False}, "needs a CUDA GPU"),
    ({"flash_available": False}, "flash_attn package is not installed"),
    ({"precision": "fp32"}, "has no fp32 kernel"),
])
def test_flash_without_what_it_needs_is_refused(change, fragment) -> None:
    with pytest.raises(ValueError, match=fragment) as e:
        resolve_attn_implementation("flash_attention_2", **{**GPU, **change})
    assert "trainer.attn_implementation=flash_attention_2" in str(e.value)


def test_unknown_value_is_refused_here_and_at_config_load() -> None:
    with pytest.raises(ValueError, match=r"trainer.attn_implementation='flash3'"):
        resolve_attn_implementation("flash3", **GPU)
    with pytest.raises(ConfigError, match="trainer.attn_implementation"):
        load_config("configs/grpo_arith_cpu.yaml", ["trainer.attn_implementation=flash3"])


def test_load_kwargs() -> None:
    assert load_kwargs(None) == {} and load_kwargs("sdpa") == {"attn_implementation": "sdpa"}
