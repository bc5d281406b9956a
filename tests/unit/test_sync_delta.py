"""XOR + zstd weight deltas: exact for every dtype, small when few bits change, loud when misused."""
from __future__ import annotations

import pytest
import torch

from orchestrator.weight_sync.delta import DeltaPayload, apply_delta, encode_delta


def _weights(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": (torch.randn(64, 16, generator=g) * 0.02).to(dtype),
            "model.layers.0.mlp.down_proj.weight": (torch.randn(16, 32, generator=g) * 0.02).to(dtype),
            "model.norm.weight": torch.ones(16, dtype=dtype)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_roundtrip_is_bit_exact(dtype):
    base = _weights(dtype)
    new = {k: (v.float() + 1e-3 * torch.randn(v.shape)).to(dtype) for k, v in base.items()}
    payload = encode_delta(base, new, base_version=3, version=4)
    out = apply_delta(base, payload)
    assert out.keys() == new.keys()
    for k in new:
        assert out[k].dtype == dtype and out[k].shape == new[k].shape
        assert torch.equal(out[k].view(torch.uint8), new[k].view(torch.uint8)), k
    assert payload.base_version == 3 and payload.version == 4


def test_changed_fraction_counts_elements_and_a_sparse_delta_compresses():
    base = _weights(torch.bfloat16)
    new = {k: v.clone() for k, v in base.items()}
    new["model.layers.0.mlp.down_proj.weight"].view(-1)[:10] += 0.01  # 10 of 16*32 + 64*16 + 16 elements
    payload = encode_delta(base, new, 0, 1)
    total = 64 * 16 + 16 * 32 + 16
    assert payload.changed == 10 and payload.numel == total
    assert payload.changed_fraction == pytest.approx(10 / total)
    assert payload.raw_bytes == 2 * total and payload.nbytes < 0.25 * payload.raw_bytes


def test_unchanged_weights_give_an_empty_change_and_the_same_tensors():
    base = _weights(torch.bfloat16)
    payload = encode_delta(base, {k: v.clone() for k, v in base.items()}, 1, 2)
    assert payload.changed == 0
    assert all(torch.equal(apply_delta(base, payload)[k], base[k]) for k in base)


def test_mismatched_names_shapes_or_dtypes_raise_naming_the_tensor():
    base = _weights(torch.bfloat16)
    with pytest.raises(ValueError, match="only in new"):
        encode_delta(base, {**base, "extra.weight": torch.zeros(2, dtype=torch.bfloat16)}, 0, 1)
    bad = {**base, "model.norm.weight": torch.ones(8, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="model.norm.weight"):
        encode_delta(base, bad, 0, 1)
    with pytest.raises(ValueError, match="model.norm.weight"):
        encode_delta(base, {**base, "model.norm.weight": torch.ones(16)}, 0, 1)


def test_apply_refuses_a_payload_for_another_model():
    base = _weights(torch.bfloat16)
    payload = encode_delta(base, _weights(torch.bfloat16, seed=1), 0, 1)
    with pytest.raises(ValueError, match="lacks"):
        apply_delta({k: v for k, v in base.items() if k != "model.norm.weight"}, payload)
    smaller = {k: v[:2] for k, v in base.items()}
    with pytest.raises(ValueError, match="bytes left|needs"):
        apply_delta(smaller, payload)
    truncated = DeltaPayload(0, 1, payload.names, payload.data[: len(payload.data) // 2], payload.changed,
                             payload.numel, payload.raw_bytes)
    with pytest.raises(Exception):
        apply_delta(base, truncated)
