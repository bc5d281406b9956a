"""Context parallelism in the trainer (`trainer.context_parallel_size` = c, issue 22): every micro-batch row
(padded or packed) is split over the c ranks of a context-parallel group with the zig-zag split, each rank
runs the decoder on its positions only, and attention is ring attention over the group
(orchestrator/algo/ring_dist.py), so activations per rank divide by c while the logprobs stay exact.

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=RING_ATTENTION)
    lp = cp_forward_logprobs(model, mb, temperature, group=cp_group)  # [b, L-1], equal on every rank of the group
    loss = compute_policy_loss(...lp...)                                # the whole micro-batch's loss, every rank
    loss.backward()          # each rank's parameter gradients: its own tokens' share; summed over the group = c = 1

How a forward runs on rank r of c:
- The row length L is padded (pad id 0, positions continuing) to a multiple of 2c, Lp; rank r holds positions
  `zigzag_positions(Lp, c)[r]` (chunks r and 2c-1-r of 2c: the causal work is balanced). Pads sit after every
  real token, so causally no real token sees them; they are never scored.
- Position ids are the un-split row's (restarting per sequence in a packed row), taken at the rank's positions,
  so RoPE is the same as with c = 1. Packed rows: document ids from the restarts of the position ids
  (`doc_ids_from_position_ids`); the ring attention masks other documents (a sequence straddling the chunk
  boundary is split over ranks and still attends only to itself).
- Attention: the model is loaded with `attn_implementation=RING_ATTENTION`, registered below with transformers'
  `AttentionInterface` (and `AttentionMaskInterface`: SDPA's mask, none inside a context-parallel forward). A call carrying the `cp_ring` keyword
  (passed through the decoder's kwargs to every attention layer, also when gradient checkpointing recomputes
  the layer) runs `ring_attention_dist`; without it the call is plain SDPA, so the same model serves ordinary
  forwards (probe, empty micro-batches of data-parallel ranks) unchanged.
- Logits only on the rank's scored positions (`logits_to_keep`: the columns with a scored position; the
  `FAST_PATH_ARCHS`, whose logits are the plain output projection: Llama, Qwen, Mistral...; others are refused), per-token logprobs there, then `gather_positions` puts every rank's values
  into the whole [b, L-1] tensor on every rank (all-gather). Its backward keeps only this rank's positions: every
  rank computes the same loss from the same gathered tensor, so the gradient of its own positions is already
  the whole gradient, and the parameter gradients of the group's ranks add up to the un-split forward's
  (the ring's backward returns each key/value block's gradient to its owner). With FSDP over all D ranks, whose
  reduce-scatter averages over D, the loss normaliser keeps `dp_size = D` (orchestrator.algo.loss_normalizer).

Why not torch's own `torch.distributed.tensor.experimental.context_parallel` (torch 2.13): it swaps the CUDA SDPA
kernels (`aten._scaled_dot_product_{flash,efficient,cudnn}_attention`) for ring versions; on CPU SDPA runs
`_scaled_dot_product_flash_attention_for_cpu` / the math kernel, which it does not handle, so the gloo path of
this project (and its CPU tests) would run un-split attention over partial keys. Its SDPA ring takes `is_causal`
only, no mask, so packed rows (a document mask) cannot be expressed; its flex-attention path all-gathers the
keys and values instead of passing them round a ring. ring_dist.py is plain torch (matmuls, isend / irecv) and
works on gloo and NCCL alike; on GPUs a fused kernel per block would be faster (not built).
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from actors.model.forward import FAST_PATH_ARCHS, MicroBatch, autocast_context
from orchestrator.algo import EntropySink, position_ids_from_attention_mask, token_logprobs
from orchestrator.algo.ring_attention import zigzag_positions
from orchestrator.algo.ring_dist import ring_attention_dist
from orchestrator.algo.sampler_support import Sampling

RING_ATTENTION = "rl_orch_ring"  # the attn_implementation name registered with transformers


@dataclass(frozen=True)
class RingCall:
    """What every attention layer of one context-parallel forward needs: the group, the padded row length
    Lp and, for packed rows, the document id of every position [b, Lp] (None: plain causal)."""

    group: object
    seq_len: int
    doc_ids: Optional[torch.Tensor] = None


def ring_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                           scaling: Optional[float] = None, cp_ring: Optional[RingCall] = None, **kwargs):
    """transformers attention function: query [b, H, l, d], key / value [b, Hkv, l, d] of this rank's positions.
    With `cp_ring`: ring attention over its group (the mask is ignored; causality and documents come from the
    positions and `cp_ring.doc_ids`), returns ([b, l, H, d], None). Without: `sdpa_attention_forward`.
    Raises ValueError for attention dropout > 0 under context parallelism (not implemented in the ring)."""
    if cp_ring is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if dropout > 0:
        raise ValueError(f"context parallelism: attention dropout {dropout} is not supported by the ring attention")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = ring_attention_dist(query, key, value, cp_ring.seq_len, cp_ring.doc_ids, group=cp_ring.group,
                              scale=scaling)
    return out.transpose(1, 2).contiguous(), None


_IN_RING = contextvars.ContextVar("rl_orch_ring_forward", default=False)  # inside cp_forward_logprobs' model call


def ring_mask(*args, **kwargs):
    """transformers mask function: None inside a context-parallel forward (the ring builds its masks per block;
    the local positions' jumps would otherwise make transformers materialise an [l, l] packed-sequence mask),
    else SDPA's."""
    return None if _IN_RING.get() else sdpa_mask(*args, **kwargs)


AttentionInterface.register(RING_ATTENTION, ring_attention_forward)
AttentionMaskInterface.register(RING_ATTENTION, ring_mask)


def doc_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Document id per position [b, T] int64 of a packed row: a new document where the position id restarts
    at 0 (ids 0, 1, ...)."""
    return torch.cumsum((position_ids == 0).long(), dim=-1) - 1


class _GatherPositions(torch.autograd.Function):
    """All-gather every rank's [b, n] values into [b, Lp] at the ranks' positions; backward: this rank's
    positions of the incoming gradient (every rank differentiates the same function of the gathered tensor)."""

    @staticmethod
    def forward(ctx, local, parts, rank, group):
        pieces = [torch.empty_like(local) for _ in parts]
        dist.all_gather(pieces, local.contiguous(), group=group)
        full = local.new_zeros((local.shape[0], sum(p.numel() for p in parts)))
        for pos, piece in zip(parts, pieces):
            full[:, pos.to(local.device)] = piece
        ctx.own = parts[rank]
        return full

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.own.to(grad.device)], None, None, None


def gather_positions(local: torch.Tensor, parts: list, rank: int, group) -> torch.Tensor:
    """[b, Lp] on every rank of `group` from each rank's `local` [b, len(parts[r])] (equal lengths);
    differentiable as `_GatherPositions` says."""
    return _GatherPositions.apply(local, parts, rank, group)


def _padded(t: torch.Tensor, length: int, fill) -> torch.Tensor:
    out = t.new_full((t.shape[0], length), fill)
    out[:, : t.shape[1]] = t
    return out


def split_row(mb: MicroBatch, c: int) -> dict:
    """The padded row of `mb` for c ranks: ids, position ids (continuing into the pad), targets and mask in
    shifted coordinates, all [b, Lp] (Lp = L rounded up to a multiple of 2c), document ids for packed rows
    (None for padded micro-batches, which are right-padded: plain causal attention is exact for their real
    tokens) and the c ranks' positions."""
    b, length = mb.input_ids.shape
    lp = -(-length // (2 * c)) * 2 * c
    pos_ids = mb.position_ids if mb.position_ids is not None else position_ids_from_attention_mask(mb.attention_mask)
    tail = pos_ids[:, -1:] + torch.arange(1, lp - length + 1)[None]
    pos_ids = torch.cat([pos_ids, tail], dim=1)
    row = dict(ids=_padded(mb.input_ids, lp, 0), position_ids=pos_ids, targets=_padded(mb.targets, lp, 0),
               mask=_padded(mb.mask, lp, False), length=length, seq_len=lp, parts=zigzag_positions(lp, c))
    row["doc_ids"] = doc_ids_from_position_ids(pos_ids) if mb.position_ids is not None else None
    return row


def cp_forward_logprobs(model, mb: MicroBatch, temperature: Sampling, precision: str = "fp32", *, group=None,
                        entropy: Optional[EntropySink] = None) -> torch.Tensor:
    """Logprobs [b, L-1] float32 of `mb` (as `actors.model.forward.forward_logprobs`: masked positions
    scored, 0 elsewhere), computed over the context-parallel `group` (every rank of it calls this with the same
    micro-batch) and equal on every rank. Differentiable; every rank of the group must run backward. Given an
    `entropy` sink, its value [b, L-1] is gathered the same way. The model must be loaded with
    `attn_implementation=RING_ATTENTION`. Raises ValueError for an architecture outside `FAST_PATH_ARCHS`."""
    if not {k.__name__ for k in type(model).__mro__} & FAST_PATH_ARCHS:  # FSDP2 subclasses the HF class
        raise ValueError(f"trainer.context_parallel_size > 1: {type(model).__name__} is not supported "
                         f"(supported: {sorted(FAST_PATH_ARCHS)})")
    c, rank = dist.get_world_size(group), dist.get_rank(group)
    device = next(model.parameters()).device
    row = split_row(mb, c)
    mine = row["parts"][rank]
    doc_ids = row["doc_ids"].to(device) if row["doc_ids"] is not None else None
    local_mask = row["mask"][:, mine].to(device)
    cols = torch.nonzero(local_mask.any(dim=0)).flatten()  # columns with a scored position in some row
    token = _IN_RING.set(True)
    try:
        # the whole model under autocast (FSDP2's root unit gathers the embeddings and the head)
        with autocast_context(precision, device):
            out = model(input_ids=row["ids"][:, mine].to(device), position_ids=row["position_ids"][:, mine].to(device),
                        attention_mask=None, use_cache=False, logits_to_keep=cols,
                        cp_ring=RingCall(group, row["seq_len"], doc_ids))
    finally:
        _IN_RING.reset(token)
    logits = out.logits[local_mask[:, cols]]  # [N, V] the scored positions, row-major like local_mask
    lp = token_logprobs(logits[None], row["targets"][:, mine].to(device)[local_mask][None], temperature)[0]
    local = torch.zeros(local_mask.shape, dtype=lp.dtype, device=device).masked_scatter(local_mask, lp)
    full = gather_positions(local, row["parts"], rank, group)[:, : row["length"] - 1]
    if entropy is not None:
        entropy.record(logits, local_mask, temperature)
        entropy.value = gather_positions(entropy.value, row["parts"], rank, group)[:, : row["length"] - 1]
    return full


def policy_logprobs(trainer, mb: MicroBatch, router_logits: Optional[list], entropy: EntropySink) -> torch.Tensor:
    """The trainer's differentiable logprobs [b, L-1] of `mb` over its context-parallel group `trainer.cp_group`
    (actors/model/policy_forward.py). Raises ValueError when router logits are asked for (the MoE
    load-balancing loss is not built for context parallelism)."""
    if router_logits is not None:
        raise ValueError("trainer.context_parallel_size > 1 with trainer.router_aux_loss_coef > 0 (a mixture of "
                         "experts' load-balancing loss) is not supported; set trainer.router_aux_loss_coef=0")
    return cp_forward_logprobs(trainer.model, mb, trainer.temperature, trainer.cfg.precision, group=trainer.cp_group,
                               entropy=entropy)


def context_parallel_group(world_size: int, c: int, device_type: str):
    """Collective (every rank of the default group calls it): the 2-D mesh (dp = world_size // c, cp = c) of the
    trainer ranks, rank = dp_rank * c + cp_rank, and this rank's context-parallel ProcessGroup (its row of c
    ranks). FSDP2 shards over all world_size ranks (actors/model/fsdp.py: the flattened mesh), so model
    states divide by world_size, activations by c."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (world_size // c, c), mesh_dim_names=("dp", "cp"))
    return mesh.get_group("cp")
