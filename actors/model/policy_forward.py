"""The trainer's differentiable forward of one micro-batch: logprobs and token entropy from the same logits.

`policy_forward` runs the shared-prompt or plain forward (actors/model/prefix_share.py), or with
trainer.context_parallel_size > 1 the context-parallel one (actors/model/context_parallel.py), collects the
token entropy of the scored positions from the logits that forward already has (orchestrator/algo/entropy.py:
no extra pass; with a graph only when `algo.entropy_coef > 0`), re-lays packed rows one sequence per row
(`per_sequence`) and applies the multi-turn loss mask. Plain torch, no Ray.
"""
from __future__ import annotations

from typing import Optional

import torch

from actors.model import context_parallel, prefix_share
from actors.model.forward import MicroBatch, apply_loss_mask, per_sequence
from orchestrator.algo import EntropySink


def policy_forward(trainer, mb: MicroBatch, prompt_ids, response_ids,
                   router_logits: Optional[list] = None) -> tuple[torch.Tensor, torch.Tensor, MicroBatch]:
    """(logprobs [b', T], entropy [b', T] float32, the micro-batch they are laid out on) for `trainer`'s
    loss: b' = b rows for a padded micro-batch, one row per sequence for a packed one; the returned
    micro-batch's mask is the loss mask (`apply_loss_mask`). `router_logits` as `micro_batch_logprobs`."""
    sink = EntropySink(grad=getattr(trainer.algo, "entropy_coef", 0.0) > 0)
    if getattr(trainer, "cp_group", None) is not None:  # trainer.context_parallel_size > 1
        logprobs = context_parallel.policy_logprobs(trainer, mb, router_logits, sink)
    else:
        logprobs = prefix_share.micro_batch_logprobs(trainer, mb, prompt_ids, response_ids, router_logits, sink)
    entropy = sink.value
    if mb.segments is not None:  # packed row -> one sequence per row: the loss aggregates per row
        entropy = per_sequence(entropy, mb)[0]
        logprobs, mb = per_sequence(logprobs, mb)
    return logprobs, entropy, apply_loss_mask(mb)
