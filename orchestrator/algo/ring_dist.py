"""Ring attention over torch.distributed ranks (forward): each rank of a c-rank process group holds its
zig-zag part of the sequence and passes key/value blocks round the ring with send/recv; the math is
`orchestrator.algo.ring_attention.rank_attention`, so the result equals the one-process `ring_attention`.

    out = ring_attention_dist(q_local, k_local, v_local, seq_len=T, doc_ids=doc_ids)   # inside a c-rank group

Step s: a rank attends to the block it holds (the one that started on rank (r - s) mod c), then sends that
block to rank r + 1 and receives the next from rank r - 1 (isend / irecv, gloo or NCCL). Communication is not
overlapped with compute, and only the forward is here: gradients of k and v would need the blocks' dK / dV
sent back round the ring (torch's context_parallel / the trainer's CP, not built yet), so this is the
reference for the distributed data flow, not a training kernel.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from orchestrator.algo.ring_attention import rank_attention, zigzag_positions


def ring_attention_dist(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int,
                        doc_ids: Optional[torch.Tensor] = None, zigzag: bool = True, group=None,
                        scale: Optional[float] = None) -> torch.Tensor:
    """This rank's attention output [B, H, L, D] for its queries q and its key/value block k, v [B, H, L, D]
    at positions zigzag_positions(seq_len, c, zigzag)[rank] (c = the group's size); doc_ids [B, seq_len]
    (packed rows) is known to every rank. Raises ValueError when q's length is not this rank's part."""
    c, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = zigzag_positions(seq_len, c, zigzag)
    if q.shape[-2] != parts[rank].numel() or k.shape != v.shape:
        raise ValueError(f"ring_attention_dist: rank {rank} holds {parts[rank].numel()} positions of seq_len="
                         f"{seq_len} over c={c}; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    held = [torch.stack([k, v]).contiguous()]
    nxt, prv = (_global(group, (rank + 1) % c), _global(group, (rank - 1) % c))

    def kv_block(step: int) -> tuple:
        if step > 0:  # pass the held block on, take the previous rank's
            src = parts[(rank - step) % c]
            incoming = held[0].new_empty((2, *k.shape[:-2], src.numel(), k.shape[-1]))
            reqs = [dist.isend(held[0], nxt, group=group), dist.irecv(incoming, prv, group=group)]
            for req in reqs:
                req.wait()
            held[0] = incoming
        block = held[0]
        return block[0], block[1], parts[(rank - step) % c]

    return rank_attention(q, parts[rank], kv_block, c, doc_ids, scale)[0]


def _global(group, group_rank: int) -> int:
    """The global rank of `group_rank` in `group` (send / recv address global ranks); None = the world."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
