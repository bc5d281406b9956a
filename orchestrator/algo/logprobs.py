"""Per-token log-probabilities and position ids, shared by the policy trainer and the reference model.

The trainer's logprobs must match what the sampler reported: both use ``log_softmax(logits / T)`` with
the sampling temperature ``T`` (correctness case C03). Left-padded batches need position ids that start
at 0 on the first real token (case C10). Pure torch; no Ray, no vLLM.
"""

from __future__ import annotations

import torch
from torch import Tensor

from orchestrator.algo.sampler_support import Sampling, as_sampler

# Upper bound on the number of float32 logit elements materialised at once (about 1 GiB).
_MAX_CHUNK_ELEMENTS = 1 << 28


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: Sampling = 1.0) -> Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``, restricted to the sampler's kept
    set when ``temperature`` is a truncating ``SamplerSettings`` (top-k / top-p / min-p: orchestrator/algo/
    sampler_support.py; the chosen token always kept).

    Computes ``logits[b, t, tokens[b, t]] / T - logsumexp(logits[b, t] / T)`` in float32, which equals
    ``log_softmax(logits.float() / T).gather(-1, tokens)`` without materialising the full
    ``[B, T, V]`` log-softmax; rows are processed in chunks so that at most ~2**28 float32 logits are
    upcast at once (V is ~50k-150k for real vocabularies). Differentiable with respect to ``logits``.

    Temperature scaling follows the sampler (vLLM / HF ``TemperatureLogitsWarper``): the importance ratio
    between trainer and sampler is 1 only if both divide by the same ``T`` (case C03).

    Args:
        logits: ``[B, T, V]`` floating (fp32, bf16 or fp16), unnormalised scores where ``logits[b, t]``
            scores ``tokens[b, t]``.
        tokens: ``[B, T]`` integer token ids in ``[0, V)``.
        temperature: sampling temperature, finite and > 0, or the whole ``SamplerSettings``.

    Returns:
        ``[B, T]`` float32 log-probabilities (<= 0).

    Raises:
        ValueError: ``temperature`` not finite or <= 0, ``logits`` not 3-D or not floating,
            ``tokens`` not integer or not of shape ``logits.shape[:2]``.
    """
    sampler = as_sampler(temperature)  # ValueError for a temperature not finite or <= 0
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(
            f"logits: expected a floating tensor [B, T, V], got shape {tuple(logits.shape)} "
            f"and dtype {logits.dtype}"
        )
    if tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"tokens: shape {tuple(tokens.shape)} does not match logits[B, T] {tuple(logits.shape[:2])}"
        )
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ValueError(f"tokens: expected an integer dtype, got {tokens.dtype}")

    batch, seq_len, vocab = logits.shape
    limit = _MAX_CHUNK_ELEMENTS // 4 if sampler.truncates else _MAX_CHUNK_ELEMENTS  # a sort's copies and indices
    rows_per_chunk = max(1, limit // max(1, seq_len * vocab))
    index = tokens.long().unsqueeze(-1)
    starts = range(0, batch, rows_per_chunk) if batch > 0 else [0]  # an empty batch keeps its graph
    out = []
    for start in starts:
        rows = slice(start, start + rows_per_chunk)
        scaled = sampler.scaled(logits[rows], tokens[rows])
        chosen = scaled.gather(-1, index[rows]).squeeze(-1)
        out.append(chosen - torch.logsumexp(scaled, dim=-1))
    return out[0] if len(out) == 1 else torch.cat(out, dim=0)


def position_ids_from_attention_mask(attention_mask: Tensor) -> Tensor:
    """Position ids for a padded batch: ``cumsum(mask) - 1``, with pad positions set to 1.

    Real tokens are numbered 0, 1, 2, ... from the first real token whatever the padding side, so a
    sequence gets the same positions (and logprobs) with or without left padding (case C10:
    ``[0, 0, 1, 1, 1] -> [1, 1, 0, 1, 2]``). Pads get the harmless value 1, as in HF ``generate`` and
    verl; their outputs must be masked out by the caller.

    Args:
        attention_mask: ``[B, T]`` bool or integer, nonzero (True / 1) on real tokens.

    Returns:
        ``[B, T]`` int64 position ids.

    Raises:
        ValueError: ``attention_mask`` is not 2-D.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask: expected [B, T], got shape {tuple(attention_mask.shape)}")
    real = attention_mask != 0
    positions = real.long().cumsum(dim=-1) - 1
    return positions.masked_fill(~real, 1)
