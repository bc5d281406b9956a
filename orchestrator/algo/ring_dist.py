"""Ring attention over torch.distributed ranks, forward and backward: each rank of a c-rank process group
holds its zig-zag part of the sequence and passes key/value blocks round the ring with send/recv; the
forward's math is `orchestrator.algo.ring_attention.rank_attention`, so the output equals the one-process
`ring_attention`, and the gradients equal autograd's through it.

    out = ring_attention_dist(q_local, k_local, v_local, seq_len=T, doc_ids=doc_ids)   # inside a c-rank group
    out.backward(grad)                                   # q_local.grad, k_local.grad, v_local.grad

Forward, step s: a rank attends to the block it holds (the one that started on rank (r - s) mod c), then
sends that block to rank r + 1 and receives the next from rank r - 1 (isend / irecv, gloo or NCCL).
Backward (FlashAttention's backward per block, Dao et al. 2022, Algorithm 2, with the forward's final
log-sum-exp): with P = exp(S - lse) and D = rowsum(dO * O), dS = P * (dO V_b^T - D), dQ += dS K_b scale,
dK_b = dS^T Q scale, dV_b = P^T dO; each block travels round the ring again with its dK_b, dV_b
accumulators, and a last exchange brings every rank its own block's gradients home. Communication is not
overlapped with compute: this is the reference for the distributed data flow, not a fast kernel.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

from orchestrator.algo.ring_attention import allowed, rank_attention, zigzag_positions


def ring_attention_dist(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int,
                        doc_ids: Optional[torch.Tensor] = None, zigzag: bool = True, group=None,
                        scale: Optional[float] = None) -> torch.Tensor:
    """This rank's attention output [B, H, L, D] for its queries q and its key/value block k, v [B, H, L, D]
    at positions zigzag_positions(seq_len, c, zigzag)[rank] (c = the group's size); doc_ids [B, seq_len]
    (packed rows) is known to every rank. Computed in fp32 (autocast off; bf16 inputs are upcast, the output
    cast back). Differentiable in q, k and v (every rank must call backward).
    Raises ValueError when q's length is not this rank's part."""
    ring = _Ring(group, seq_len, zigzag, q.device)
    if q.shape[-2] != ring.parts[ring.rank].numel() or k.shape != v.shape:
        raise ValueError(f"ring_attention_dist: rank {ring.rank} holds {ring.parts[ring.rank].numel()} positions of "
                         f"seq_len={seq_len} over c={ring.c}; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    # in fp32 whatever the inputs (bf16 under autocast): the scores, log-sum-exps and merges; out in q's dtype
    with torch.autocast(q.device.type, enabled=False):
        out = _RingAttention.apply(q.float(), k.float(), v.float(), ring, doc_ids, scale)
    return out.to(q.dtype)


class _Ring:
    """The group's size c, this rank, every rank's positions (on the tensors' device), and the exchange with the
    neighbours."""

    def __init__(self, group, seq_len: int, zigzag: bool, device=None):
        self.group, self.c, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.parts = [p.to(device) for p in zigzag_positions(seq_len, self.c, zigzag)]
        self.next, self.prev = _global(group, (self.rank + 1) % self.c), _global(group, (self.rank - 1) % self.c)

    def source(self, step: int) -> torch.Tensor:
        """Positions of the block this rank holds at `step` (it started on rank (rank - step) mod c)."""
        return self.parts[(self.rank - step) % self.c]

    def exchange(self, held: torch.Tensor, incoming_len: int) -> torch.Tensor:
        """Send `held` [n, B, H, L, D] to the next rank, return the previous rank's (length incoming_len)."""
        incoming = held.new_empty((*held.shape[:-2], incoming_len, held.shape[-1]))
        reqs = [dist.isend(held.contiguous(), self.next, group=self.group),
                dist.irecv(incoming, self.prev, group=self.group)]
        for req in reqs:
            req.wait()
        return incoming


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: _Ring, doc_ids, scale: float):
        held = [torch.stack([k, v])]

        def kv_block(step: int) -> tuple:
            if step > 0:  # pass the held block on, take the previous rank's
                held[0] = ring.exchange(held[0], ring.source(step).numel())
            return held[0][0], held[0][1], ring.source(step)

        out, lse = rank_attention(q, ring.parts[ring.rank], kv_block, ring.c, doc_ids, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.doc_ids, ctx.scale = ring, doc_ids, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        delta = (dout * out).sum(-1, keepdim=True)  # D = rowsum(dO * O)
        dq = torch.zeros_like(q)
        held = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        for step in range(ring.c):
            if step > 0:
                held = ring.exchange(held, ring.source(step).numel())
            mask = allowed(ring.parts[ring.rank], ring.source(step), ctx.doc_ids)[:, None]
            if bool(mask.any()):
                kb, vb = held[0], held[1]
                p = torch.exp((torch.matmul(q, kb.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
                              - lse[..., None])
                ds = p * (torch.matmul(dout, vb.transpose(-1, -2)) - delta)
                dq += torch.matmul(ds, kb) * scale
                held[2] += torch.matmul(ds.transpose(-1, -2), q) * scale
                held[3] += torch.matmul(p.transpose(-1, -2), dout)
        grads = held[2:] if ring.c == 1 else ring.exchange(held[2:], ring.parts[ring.rank].numel())
        return dq, grads[0], grads[1], None, None, None


def _global(group, group_rank: int) -> int:
    """The global rank of `group_rank` in `group` (send / recv address global ranks); None = the world."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
