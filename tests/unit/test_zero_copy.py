"""SharedTensors (actors/weight_sync/zero_copy.py): weight tensors pickle as out-of-band raw buffers."""
from __future__ import annotations

import pickle

import torch

from actors.weight_sync.zero_copy import SharedTensors


def _roundtrip(obj):
    buffers = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)  # what Ray does
    return body, buffers, pickle.loads(body, buffers=buffers)


def test_bits_names_dtypes_shapes_survive() -> None:
    g = torch.Generator().manual_seed(0)
    named = [("w", torch.randn(3, 4, generator=g)), ("bf", torch.randn(5, generator=g).to(torch.bfloat16)),
             ("empty", torch.empty(0)), ("scalar", torch.tensor(2.5)), ("strided", torch.randn(4, 6, generator=g).t()),
             ("ints", torch.arange(7, dtype=torch.int64))]
    _, _, back = _roundtrip(SharedTensors(named))
    assert type(back) is list and [n for n, _ in back] == [n for n, _ in named]
    for (_, a), (_, b) in zip(named, back):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_tensor_bytes_travel_out_of_band() -> None:
    t = torch.ones(1 << 20)  # 4 MiB of fp32
    body, buffers, _ = _roundtrip(SharedTensors([("model.embed_tokens.weight", t)]))
    assert len(buffers) == 1 and buffers[0].raw().nbytes == 4 << 20
    assert len(body) < 1024  # a plain tensor's pickle carries all 4 MiB in-band
    assert len(pickle.dumps([("x", t)], protocol=5, buffer_callback=lambda b: None)) > 4 << 20
