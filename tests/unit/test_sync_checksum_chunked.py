"""The chunked float64 checksums (orchestrator/weight_sync/checksum.py, issue 7) against closed forms."""
from __future__ import annotations

import torch

from orchestrator.weight_sync import checksum
from orchestrator.weight_sync.checksum import group_checksums


def test_multi_chunk_tensor_matches_closed_forms() -> None:
    # 0, 1, ..., n-1 in fp32 (exact below 2^24), n spans 2.5 chunks and a partial last one:
    # sum = n(n-1)/2, sum of squares = (n-1)n(2n-1)/6, both exact in float64 here
    n = 5 * checksum._CHUNK // 2 + 7
    t = torch.arange(n, dtype=torch.float32).reshape(-1, 1)  # 2-D: the flattening is part of the test
    s, ss, count = group_checksums([("model.layers.0.mlp.up_proj.weight", t)])["model.layers.0.mlp"]
    assert count == n
    assert s == n * (n - 1) / 2
    assert abs(ss - (n - 1) * n * (2 * n - 1) / 6) <= 1e-12 * ss


def test_chunked_equals_single_pass_on_random_weights() -> None:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3 * checksum._CHUNK + 5, generator=g).to(torch.bfloat16)  # bf16 like an engine
    x = big.to(torch.float64)
    s, ss, _ = group_checksums([("a.b.weight", big)])["a"]
    assert abs(s - float(x.sum())) <= 1e-9 * float(x.abs().sum())
    assert abs(ss - float((x * x).sum())) <= 1e-12 * ss


def test_empty_tensor_counts_zero() -> None:  # vLLM's CPU backend leaves packed parameters empty
    assert group_checksums([("a.b.weight", torch.empty(0))])["a"] == [0.0, 0.0, 0.0]


def test_a_tensor_listed_twice_counts_under_both_names(monkeypatch) -> None:
    # a tied head: the trainer lists the embedding again as lm_head.weight; one pass, both groups filled
    emb = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    calls = []
    real = checksum._sums_f64
    monkeypatch.setattr(checksum, "_sums_f64", lambda flat: calls.append(flat.numel()) or real(flat))
    sums = group_checksums([("model.embed_tokens.weight", emb), ("model.norm.weight", torch.ones(3)),
                            ("lm_head.weight", emb)])
    assert sums["lm_head"] == [15.0, 55.0, 6.0]  # 0+1+...+5, 0+1+4+9+16+25
    assert sums["model"] == [18.0, 58.0, 9.0]
    assert calls == [6, 3]
    # a different view of the same memory is a different tensor: summed on its own
    assert group_checksums([("a.b.w", emb), ("c.d.w", emb.t())]) == {"a": [15.0, 55.0, 6.0], "c": [15.0, 55.0, 6.0]}
