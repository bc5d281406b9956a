"""Ring attention's math (orchestrator/algo/ring_attention.py) equals full causal attention in fp32: several
c, zig-zag and contiguous splits, packed rows whose documents straddle chunk boundaries, gradients too."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from orchestrator.algo.ring_attention import (allowed, block_attention, causal_pairs, doc_ids_from_cu_seqlens,
                                              merge, ring_attention, zigzag_positions)


def _qkv(b=2, h=3, t=24, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, dtype=torch.float32) for _ in range(3)]


def _reference(q, k, v, doc_ids=None):
    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool).tril()[None]
    if doc_ids is not None:
        mask = mask & (doc_ids[:, :, None] == doc_ids[:, None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])


def test_zigzag_positions_hand_checked():
    parts = zigzag_positions(8, 2)  # 4 chunks of 2: rank 0 = chunks 0 and 3, rank 1 = chunks 1 and 2
    assert [p.tolist() for p in parts] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [p.tolist() for p in zigzag_positions(6, 3, zigzag=False)] == [[0, 1], [2, 3], [4, 5]]
    # uneven: 10 tokens in 4 chunks of 3, 3, 2, 2
    assert [p.tolist() for p in zigzag_positions(10, 2)] == [[0, 1, 2, 8, 9], [3, 4, 5, 6, 7]]
    with pytest.raises(ValueError, match="seq_len >= 8"):
        zigzag_positions(7, 4)


def test_zigzag_balances_the_causal_load():
    # 16 tokens, c = 2: rank 0 holds 0-3 and 12-15: (1+2+3+4) + (13+14+15+16) = 68; rank 1: 5+...+12 = 68
    assert causal_pairs(16, 2) == [68, 68]
    assert causal_pairs(16, 2, zigzag=False) == [36, 100]
    assert len(set(causal_pairs(64, 4))) == 1


def test_merge_of_two_blocks_hand_computed():
    # one query, scores 0 and log 3 against two single-key blocks: softmax weights 1/4 and 3/4
    a = (torch.tensor([[[[2.0]]]]), torch.tensor([[[0.0]]]))
    b = (torch.tensor([[[[6.0]]]]), torch.tensor([[[math.log(3.0)]]]))
    out, lse = merge(a, b)
    assert out.item() == pytest.approx(0.25 * 2 + 0.75 * 6)
    assert lse.item() == pytest.approx(math.log(4.0))
    empty = (torch.zeros(1, 1, 1, 1), torch.full((1, 1, 1), float("-inf")))
    out, lse = merge(empty, b)  # an empty partial result changes nothing
    assert out.item() == pytest.approx(6.0) and lse.item() == pytest.approx(math.log(3.0))


def test_block_attention_masked_row_is_empty():
    q, k, v = _qkv(1, 1, 2, 4)
    out, lse = block_attention(q, k, v, torch.tensor([[[True, False], [False, False]]]), 0.5)
    assert torch.isinf(lse[0, 0, 1]) and out[0, 0, 1].abs().sum() == 0
    assert torch.allclose(out[0, 0, 0], v[0, 0, 0])


@pytest.mark.parametrize("c, t, zigzag", [(1, 16, True), (2, 16, True), (3, 24, True), (4, 32, True),
                                           (4, 37, True), (3, 20, False), (5, 23, False)])
def test_equals_full_causal_attention(c, t, zigzag):
    q, k, v = _qkv(t=t, seed=c + t)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ring_attention(q, k, v, c, zigzag=zigzag), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("c", [2, 3, 4])
def test_packed_rows_equal_the_document_masked_attention(c):
    t = 24
    # row 0: documents of 5, 9, 7 tokens and 3 padding; row 1: 11 + 13. With c = 3 (6 chunks of 4) the
    # document at 5..13 straddles chunk boundaries 8 and 12; each row has its own boundaries.
    docs = torch.stack([doc_ids_from_cu_seqlens(torch.tensor([0, 5, 14, 21]), t),
                        doc_ids_from_cu_seqlens(torch.tensor([0, 11, 24]), t)])
    assert docs[0].tolist() == [0] * 5 + [1] * 9 + [2] * 7 + [3] * 3
    q, k, v = _qkv(t=t, seed=7 + c)
    ref = _reference(q, k, v, docs)
    assert torch.allclose(ring_attention(q, k, v, c, doc_ids=docs), ref, atol=1e-5, rtol=1e-5)
    unpacked = ring_attention(q, k, v, c)
    assert not torch.allclose(unpacked, ref, atol=1e-3)  # the document mask matters


def test_a_sequence_straddling_a_chunk_boundary_sees_only_itself():
    # c = 2, 12 tokens in 4 chunks of 3: document 1 (positions 2..7) crosses chunk boundaries 3 and 6, so
    # its tokens live on both ranks; its output equals attention over that document alone
    t = 12
    docs = doc_ids_from_cu_seqlens(torch.tensor([0, 2, 8, 12]), t)[None]
    q, k, v = _qkv(b=1, t=t, seed=3)
    out = ring_attention(q, k, v, 2, doc_ids=docs)
    alone = F.scaled_dot_product_attention(q[..., 2:8, :], k[..., 2:8, :], v[..., 2:8, :], is_causal=True)
    assert torch.allclose(out[..., 2:8, :], alone, atol=1e-5)
    assert allowed(torch.tensor([7]), torch.tensor([1, 2]), docs).tolist() == [[[False, True]]]


def test_gradients_equal_full_attention():
    q, k, v = (x.requires_grad_() for x in _qkv(t=20, seed=11))
    docs = doc_ids_from_cu_seqlens(torch.tensor([0, 7, 20]), 20).expand(2, 20)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((ring_attention(q, k, v, 2, doc_ids=docs) * w).sum(), (q, k, v))
    ref = torch.autograd.grad((_reference(q, k, v, docs) * w).sum(), (q, k, v))
    for g, r in zip(grads, ref):
        assert torch.allclose(g, r, atol=1e-5, rtol=1e-5)


def test_cu_seqlens_errors_name_the_input():
    with pytest.raises(ValueError, match="cu_seqlens"):
        doc_ids_from_cu_seqlens(torch.tensor([0, 5, 3]), 8)
    with pytest.raises(ValueError, match="cu_seqlens"):
        doc_ids_from_cu_seqlens(torch.tensor([0, 9]), 8)
