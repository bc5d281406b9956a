"""Token entropy of the policy from the logits a forward already computed (no extra forward pass).

``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}`` with ``z_t = logits_t / T`` (the sampling
temperature, as the logprobs: case C03), in float32, over chunks of at most ~2**28 logits so that the
float32 upcast of a ``[N, V]`` block (V ~ 150k) stays near 1 GiB. With ``grad=True`` each chunk runs under
activation checkpointing: its softmax is recomputed in backward instead of being kept, so the entropy
bonus (``algo.entropy_coef > 0``) costs no ``[N, V]`` float32 activations beyond the chunk being worked on.
With a truncating ``SamplerSettings`` (top-k / top-p / min-p) the entropy is the sampled distribution's, over the
sampler's kept set (orchestrator/algo/sampler_support.py). Pure torch; no Ray, no vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from orchestrator.algo.sampler_support import Sampling, as_sampler

__all__ = ["EntropySink", "token_entropy"]

_MAX_CHUNK_ELEMENTS = 1 << 28


def _rows_entropy(scaled: Tensor) -> Tensor:
    """``log s + m - <e, z> / s`` with ``m = max z``, ``e = exp(z - m)``, ``s = sum e``: the entropy with one
    exp pass over ``[n, V]`` (half the time of logsumexp + softmax on CPU). Logits finite, or -inf where a
    truncation dropped the token (those count 0)."""
    z = scaled.float()
    with torch.autocast(device_type=z.device.type, enabled=False):  # float32 even inside bf16 autocast
        m = z.amax(dim=-1, keepdim=True)
        e = torch.exp(z - m)
        s = e.sum(dim=-1)
        finite = z.masked_fill(z == -math.inf, 0.0) if bool((z == -math.inf).any()) else z
        return torch.log(s) + m.squeeze(-1) - torch.linalg.vecdot(e, finite) / s


def token_entropy(logits: Tensor, temperature: Sampling = 1.0, grad: bool = False) -> Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position (over the sampler's kept set when
    ``temperature`` is a truncating ``SamplerSettings``).

    Args:
        logits: ``[..., V]`` floating (fp32 / bf16 / fp16).
        temperature: finite and > 0, or the whole ``SamplerSettings``.
        grad: differentiable in ``logits`` (chunks checkpointed) when True; computed under ``no_grad`` (a
            detached metric) when False.

    Returns:
        ``logits.shape[:-1]`` float32, >= 0 (up to rounding), <= log V (<= log of the kept count when truncated).
        Finite logits are assumed (NaN in, NaN out).

    Raises:
        ValueError: ``temperature`` not finite or <= 0, ``logits`` not floating or 0-D.
    """
    sampler = as_sampler(temperature)  # ValueError for a temperature not finite or <= 0
    if logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError(f"logits: expected a floating tensor [..., V], got shape {tuple(logits.shape)} "
                         f"and dtype {logits.dtype}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    rows = max(1, (_MAX_CHUNK_ELEMENTS // (4 if sampler.truncates else 1)) // max(1, vocab))
    out = []
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        for start in range(0, max(flat.shape[0], 1), rows):
            chunk = sampler.scaled(flat[start : start + rows])
            if grad and chunk.requires_grad:
                out.append(checkpoint(_rows_entropy, chunk, use_reentrant=False))
            else:
                out.append(_rows_entropy(chunk))
    return (out[0] if len(out) == 1 else torch.cat(out)).reshape(lead)


@dataclass
class EntropySink:
    """Where a forward leaves the token entropy of the positions it scored (``actors/model/forward.py``).

    ``grad``: keep the graph (the entropy bonus, ``algo.entropy_coef > 0``) or not (the ``actor/entropy``
    metric alone). ``value``: after ``record``, ``[b, L-1]`` float32 laid out like the micro-batch's mask,
    0 off it.
    """

    grad: bool = False
    value: Optional[Tensor] = None

    def record(self, logits: Tensor, mask: Tensor, temperature: Sampling) -> None:
        """logits: ``[N, V]`` scoring the ``N = mask.sum()`` True positions of ``mask`` ``[b, L-1]`` in order."""
        ent = token_entropy(logits, temperature, grad=self.grad)
        self.value = torch.zeros(mask.shape, dtype=ent.dtype, device=ent.device).masked_scatter(mask, ent)
