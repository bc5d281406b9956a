"""Ring attention, the math (pure torch, one process): blockwise causal attention over c context-parallel
ranks, merged with the online softmax, with the zig-zag split and packed sequences.

    out = ring_attention(q, k, v, c=4)                            # == causal SDPA over the whole sequence
    out = ring_attention(q, k, v, c=4, doc_ids=doc_ids_from_cu_seqlens(cu, T))   # packed: no cross-document
    parts = zigzag_positions(T, c)            # rank r holds chunks r and 2c-1-r of 2c equal chunks

Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context"):
each of c ranks holds the queries, keys and values of its part of the sequence; in c steps the key/value
blocks travel round the ring (step s: rank r holds the block of rank (r - s) mod c), and each rank attends
its queries to the block it holds. The partial results merge exactly with the online softmax
(Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022, sec. 3.1): a block gives
    o_b = softmax(S_b) V_b  and  l_b = logsumexp(S_b)   (S_b = q k_b^T / sqrt(d), masked entries -inf)
and two partial results (o_1, l_1), (o_2, l_2) over disjoint key sets merge as
    l = log(exp(l_1) + exp(l_2)),   o = exp(l_1 - l) o_1 + exp(l_2 - l) o_2,
which is softmax attention over the union. Under a causal mask a contiguous split gives rank r work
proportional to r + 1/2; the zig-zag split (the load balancing of Megatron-LM / Transformer Engine context
parallelism) cuts the sequence into 2c chunks and gives rank r chunks r and 2c-1-r, so every rank
computes the same number of query-key pairs (`causal_pairs`). Packed rows: `doc_ids` [B, T] names each
position's document; a query attends to key positions <= its own in the same document only (case C11).

`rank_attention` is what one rank computes; `ring_attention` runs it for every rank in one process (the
reference the distributed version, orchestrator/algo/ring_dist.py, is tested against). Shapes: q, k, v
[B, H, T, D] (K/V heads already repeated to H), fp32 or bf16; positions are int64 indices into T.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

Merged = tuple  # (out [B, H, Lq, D], lse [B, H, Lq]); lse = -inf where no key was attended yet


def zigzag_positions(seq_len: int, c: int, zigzag: bool = True) -> list[torch.Tensor]:
    """Positions each of c ranks holds. zigzag: 2c chunks (torch.tensor_split: sizes differ by at most one),
    rank r gets chunks r and 2c-1-r; else c contiguous chunks. Raises ValueError when c < 1 or a chunk
    would be empty (seq_len < 2c, or < c without zigzag)."""
    pieces = 2 * c if zigzag else c
    if c < 1 or seq_len < pieces:
        raise ValueError(f"ring attention: c={c} needs c >= 1 and seq_len >= {pieces} (got seq_len={seq_len})")
    chunks = torch.tensor_split(torch.arange(seq_len), pieces)
    if not zigzag:
        return list(chunks)
    return [torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)]


def doc_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Document id per position [total] from cumulative lengths [n + 1] (0, l1, l1 + l2, ...); positions
    past the last boundary (padding) get id n. Raises ValueError when cu_seqlens is not non-decreasing
    from 0 or exceeds total."""
    cu = torch.as_tensor(cu_seqlens, dtype=torch.long)
    if cu.numel() < 1 or cu[0] != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > total:
        raise ValueError(f"cu_seqlens={cu.tolist()} must rise from 0 to at most total={total}")
    return torch.bucketize(torch.arange(total), cu[1:], right=True)


def allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, doc_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """Mask [B or 1, Lq, Lk], True where query position q_pos[i] may attend key position k_pos[j]:
    k_pos <= q_pos (causal) and, with doc_ids [B, T], the same document."""
    mask = (k_pos[None, :] <= q_pos[:, None])[None]
    if doc_ids is not None:
        mask = mask & (doc_ids[:, q_pos][:, :, None] == doc_ids[:, k_pos][:, None, :])
    return mask


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float) -> Merged:
    """Softmax attention of q [B, H, Lq, D] over one key block k, v [B, H, Lk, D] under mask [B|1, Lq, Lk]:
    (out [B, H, Lq, D], lse [B, H, Lq]); a query with no allowed key gets out 0 and lse -inf."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return torch.matmul(probs, v), lse


def merge(a: Optional[Merged], b: Merged) -> Merged:
    """Online-softmax merge of two partial results over disjoint key sets (FlashAttention's rescaling):
    lse = logaddexp(lse_a, lse_b), out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b. a None = empty."""
    if a is None:
        return b
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w_a, w_b = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
    return out_a * w_a[..., None] + out_b * w_b[..., None], lse


def rank_attention(q: torch.Tensor, q_pos: torch.Tensor, kv_block: Callable[[int], tuple], c: int,
                   doc_ids: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> Merged:
    """What one rank computes: its queries q [B, H, Lq, D] at positions q_pos [Lq] against the c key/value
    blocks of the ring, `kv_block(step) -> (k, v, k_pos)` (step 0 is the rank's own block), merged online.
    Blocks no query may attend (causally all in the future, or other documents) are skipped.
    Returns (out [B, H, Lq, D], lse [B, H, Lq])."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    acc: Optional[Merged] = None
    for step in range(c):
        k, v, k_pos = kv_block(step)
        mask = allowed(q_pos, k_pos, doc_ids)
        if bool(mask.any()):
            acc = merge(acc, block_attention(q, k, v, mask, scale))
    if acc is None:  # cannot happen under a causal mask (a query sees itself); kept for empty q
        return torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    return acc


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: int, doc_ids: Optional[torch.Tensor] = None,
                   zigzag: bool = True, scale: Optional[float] = None) -> torch.Tensor:
    """Causal attention of q, k, v [B, H, T, D] computed as c ring ranks would (one process): each rank's
    positions from `zigzag_positions`, its output from `rank_attention` with the block of rank
    (r - step) mod c at each step, the outputs put back in sequence order. doc_ids [B, T]: packed rows.
    Equals F.scaled_dot_product_attention(q, k, v, is_causal=True) (with the document mask when packed)."""
    parts = zigzag_positions(q.shape[-2], c, zigzag)
    out = torch.empty_like(q)
    for r, pos in enumerate(parts):
        def kv_block(step: int, r: int = r) -> tuple:
            src = parts[(r - step) % c]
            return k[..., src, :], v[..., src, :], src
        out[..., pos, :] = rank_attention(q[..., pos, :], pos, kv_block, c, doc_ids, scale)[0]
    return out


def causal_pairs(seq_len: int, c: int, zigzag: bool = True) -> list[int]:
    """Query-key pairs each rank computes under the causal mask (its load): sum over its queries at
    position p of p + 1 keys. zigzag gives every rank the same count when 2c divides seq_len."""
    return [int((pos + 1).sum()) for pos in zigzag_positions(seq_len, c, zigzag)]
