"""Unit tests of orchestrator.weight_sync.checksum: per-group weight checksums that survive vLLM's fused layouts."""

from __future__ import annotations

import pytest
import torch

from orchestrator.weight_sync import WeightMismatchError, checksum_group, compare_checksums, group_checksums


def test_checksum_group_names() -> None:
    assert checksum_group("model.layers.3.self_attn.q_proj.weight") == "model.layers.3.self_attn"
    assert checksum_group("model.layers.3.self_attn.qkv_proj.weight") == "model.layers.3.self_attn"
    assert checksum_group("model.layers.3.self_attn.q_proj.bias") == "model.layers.3.self_attn"
    assert checksum_group("model.layers.0.mlp.gate_proj.weight") == "model.layers.0.mlp"
    assert checksum_group("model.layers.0.mlp.gate_up_proj.weight") == "model.layers.0.mlp"
    assert checksum_group("model.layers.0.input_layernorm.weight") == "model.layers.0"
    assert checksum_group("model.embed_tokens.weight") == "model"
    assert checksum_group("lm_head.weight") == "lm_head"
    assert checksum_group("scale") == "scale"


def test_group_checksums_hand_values() -> None:
    sums = group_checksums([
        ("model.layers.0.self_attn.q_proj.weight", torch.tensor([[1.0, 2.0], [3.0, -4.0]])),
        ("model.layers.0.self_attn.k_proj.weight", torch.tensor([0.5, -0.5])),
        ("lm_head.weight", torch.tensor([[2.0, 2.0, 2.0]], dtype=torch.bfloat16)),
    ])
    assert sums == {
        "model.layers.0.self_attn": [2.0, 30.5, 6.0],  # sum 1+2+3-4+0.5-0.5; squares 1+4+9+16+0.25+0.25
        "lm_head": [6.0, 12.0, 3.0],
    }


def _hf_layer(gen: torch.Generator, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    p = "model.layers.0."
    return {
        p + "self_attn.q_proj.weight": torch.randn(64, 64, generator=gen).to(dtype),
        p + "self_attn.k_proj.weight": torch.randn(16, 64, generator=gen).to(dtype),
        p + "self_attn.v_proj.weight": torch.randn(16, 64, generator=gen).to(dtype),
        p + "self_attn.o_proj.weight": torch.randn(64, 64, generator=gen).to(dtype),
        p + "mlp.gate_proj.weight": torch.randn(128, 64, generator=gen).to(dtype),
        p + "mlp.up_proj.weight": torch.randn(128, 64, generator=gen).to(dtype),
        p + "mlp.down_proj.weight": torch.randn(64, 128, generator=gen).to(dtype),
        p + "input_layernorm.weight": torch.ones(64, dtype=dtype),
        "model.embed_tokens.weight": torch.randn(97, 64, generator=gen).to(dtype),
        "lm_head.weight": torch.randn(97, 64, generator=gen).to(dtype),
    }


def _vllm_layout(hf: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The same weights as vLLM holds them: q/k/v and gate/up fused, other tensors repacked."""
    p = "model.layers.0."
    qkv = torch.cat([hf[p + f"self_attn.{x}_proj.weight"] for x in "qkv"], dim=0)
    gate_up = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]], dim=0)
    return [
        ("lm_head.weight", hf["lm_head.weight"].t().contiguous()),  # transposed layout
        (p + "mlp.gate_up_proj.weight", gate_up.flip(0)),  # rows permuted
        (p + "self_attn.qkv_proj.weight", qkv.reshape(-1)),  # flattened
        (p + "self_attn.o_proj.weight", hf[p + "self_attn.o_proj.weight"].reshape(32, 128)),
        (p + "mlp.down_proj.weight", hf[p + "mlp.down_proj.weight"][torch.randperm(64)]),
        (p + "input_layernorm.weight", hf[p + "input_layernorm.weight"]),
        ("model.embed_tokens.weight", hf["model.embed_tokens.weight"]),
    ]


def test_invariant_to_fusing_permuting_and_reshaping() -> None:
    hf = _hf_layer(torch.Generator().manual_seed(0))
    expected = group_checksums(hf.items())
    actual = group_checksums(_vllm_layout(hf))
    assert set(expected) == {"model.layers.0.self_attn", "model.layers.0.mlp", "model.layers.0", "model",
                             "lm_head"}
    assert set(actual) == set(expected)
    for group in expected:
        assert actual[group] == pytest.approx(expected[group], rel=1e-12), group
    assert expected["model.layers.0.self_attn"][2] == 64 * 64 * 2 + 16 * 64 * 2
    compare_checksums(expected, actual)  # passes
    compare_checksums(expected, expected)


def test_invariant_to_dtype_of_exact_values() -> None:
    hf = _hf_layer(torch.Generator().manual_seed(1))
    as_fp32 = [(k, v.float()) for k, v in hf.items()]  # bf16 -> fp32 is exact
    compare_checksums(group_checksums(hf.items()), group_checksums(as_fp32))


def _next_bf16(x: torch.Tensor) -> torch.Tensor:
    """The next representable bf16 value above a positive bf16 scalar."""
    bits = x.view(torch.int16) + 1
    return bits.view(torch.bfloat16)


def test_single_changed_bf16_element_is_caught() -> None:
    name = "model.layers.0.mlp.up_proj.weight"
    hf = _hf_layer(torch.Generator().manual_seed(2))
    hf[name][17, 5] = 1.0
    expected = group_checksums(hf.items())
    w = hf[name].clone()
    w[17, 5] = _next_bf16(w[17, 5])  # one ulp: 1.0 -> 1.0078125
    assert w[17, 5].item() == 1.0078125 and (w != hf[name]).sum().item() == 1
    corrupted = dict(hf, **{name: w})
    with pytest.raises(WeightMismatchError) as e:
        compare_checksums(expected, group_checksums(_vllm_layout(corrupted)), where="rollout worker 1")
    msg = str(e.value)
    assert msg.startswith("rollout worker 1: tensor group 'model.layers.0.mlp' differs")
    assert "(sum:" in msg
    # other groups are untouched
    actual = group_checksums(_vllm_layout(corrupted))
    for group in ("model.layers.0.self_attn", "model", "lm_head", "model.layers.0"):
        assert actual[group] == pytest.approx(expected[group], rel=1e-12)


def test_sign_flip_is_caught_by_the_sum() -> None:
    exp = group_checksums([("a.b.weight", torch.tensor([1.0, 2.0]))])
    got = group_checksums([("a.b.weight", torch.tensor([1.0, -2.0]))])
    with pytest.raises(WeightMismatchError, match=r"'a' differs .*\(sum: trainer 3\.0, engine -1\.0\)"):
        compare_checksums(exp, got)


def test_same_sum_different_squares_is_caught() -> None:
    # same sum (3.0), different sum of squares (5 vs 4.5)
    exp = group_checksums([("x.y.w", torch.tensor([1.0, 2.0]))])
    got = group_checksums([("x.y.w", torch.tensor([1.5, 1.5]))])
    with pytest.raises(WeightMismatchError, match=r"sum of squares: trainer 5\.0, engine 4\.5"):
        compare_checksums(exp, got)


def test_lost_tensor_changes_the_element_count() -> None:
    exp = group_checksums([("x.y.w", torch.tensor([1.0, 2.0])), ("x.y.b", torch.zeros(3))])
    got = group_checksums([("x.y.w", torch.tensor([1.0, 2.0]))])
    with pytest.raises(WeightMismatchError, match=r"element count: trainer 5\.0, engine 2\.0"):
        compare_checksums(exp, got)


def test_missing_group_is_named() -> None:
    hf = _hf_layer(torch.Generator().manual_seed(3))
    expected = group_checksums(hf.items())
    actual = group_checksums((k, v) for k, v in _vllm_layout(hf) if not k.startswith("lm_head"))
    with pytest.raises(WeightMismatchError) as e:
        compare_checksums(expected, actual)
    assert str(e.value) == "engine: tensor group 'lm_head' is missing after the weight sync"


def test_extra_engine_group_is_not_an_error() -> None:
    exp = group_checksums([("x.y.w", torch.ones(2))])
    got = group_checksums([("x.y.w", torch.ones(2)), ("rotary.cache.inv_freq", torch.ones(4))])
    compare_checksums(exp, got)
