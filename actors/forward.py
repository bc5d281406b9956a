"""Policy forward passes shared by the trainer and the reference model (plain torch, no Ray).

A trajectory batch arrives as lists (prompt ids, response ids, per-token values). `collate` right-pads
one micro-batch into tensors in *shifted* coordinates: position p of a [b, L-1] tensor scores the
token at p + 1, so the response tokens of sample i sit at positions len(prompt_i)-1 ...
len(prompt_i)+len(response_i)-2. Per-token values given per response token (rollout logprobs,
reference logprobs) are scattered to the same positions, so every tensor lines up with `mask`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from orchestrator.algo import position_ids_from_attention_mask, token_logprobs


@dataclass
class MicroBatch:
    """Tensors of one micro-batch. input_ids/attention_mask: [b, L] int64; the rest [b, L-1]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor  # int64, input_ids[:, 1:]
    mask: torch.Tensor  # bool, True on response tokens
    values: dict[str, torch.Tensor]  # float32 per-token values scattered onto mask positions


def collate(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
            per_token: Optional[dict[str, Sequence[Sequence[float]]]] = None, pad_id: int = 0) -> MicroBatch:
    """Right-pad prompt+response sequences into a MicroBatch.

    Raises ValueError when a response is empty or a per-token list's length differs from its response.
    """
    per_token = per_token or {}
    b = len(prompt_ids)
    if b == 0 or b != len(response_ids):
        raise ValueError(f"collate: got {b} prompts and {len(response_ids)} responses")
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    L = max(lengths)
    input_ids = torch.full((b, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, L), dtype=torch.long)
    mask = torch.zeros((b, L - 1), dtype=torch.bool)
    values = {k: torch.zeros((b, L - 1), dtype=torch.float32) for k in per_token}
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        if len(r) == 0:
            raise ValueError(f"collate: sample {i} has an empty response")
        input_ids[i, : lengths[i]] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attention_mask[i, : lengths[i]] = 1
        start = len(p) - 1
        mask[i, start : start + len(r)] = True
        for k, rows in per_token.items():
            if len(rows[i]) != len(r):
                raise ValueError(f"collate: {k} of sample {i} has {len(rows[i])} values for {len(r)} response tokens")
            values[k][i, start : start + len(r)] = torch.tensor(rows[i], dtype=torch.float32)
    return MicroBatch(input_ids, attention_mask, input_ids[:, 1:], mask, values)


def autocast_context(precision: str):
    """bf16 autocast on the model's device for "bf16-autocast", a no-op for "fp32"."""
    if precision == "bf16-autocast":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward_logprobs(model, mb: MicroBatch, temperature: float, precision: str = "fp32") -> torch.Tensor:
    """Logprobs [b, L-1] float32 of each next token under `model`, with the sampling temperature
    applied (log_softmax(logits / T), case C03); position ids from the attention mask (case C10)."""
    device = next(model.parameters()).device
    position_ids = position_ids_from_attention_mask(mb.attention_mask)
    with autocast_context(precision):
        logits = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device),
                       position_ids=position_ids.to(device), use_cache=False).logits
    return token_logprobs(logits[:, :-1], mb.targets.to(device), temperature)


def response_values(t: torch.Tensor, mb: MicroBatch) -> list[list[float]]:
    """Inverse of collate's scatter: the per-response-token values of `t` [b, L-1] as lists."""
    return [t[i][mb.mask[i]].tolist() for i in range(t.shape[0])]


@torch.no_grad()
def batch_logprobs(model, prompt_ids, response_ids, temperature: float, micro_batch_size: int,
                   precision: str = "fp32", pad_id: int = 0) -> list[list[float]]:
    """Response-token logprobs of every sample (no gradient), computed in micro-batches."""
    out: list[list[float]] = []
    for s in range(0, len(prompt_ids), micro_batch_size):
        mb = collate(prompt_ids[s : s + micro_batch_size], response_ids[s : s + micro_batch_size], pad_id=pad_id)
        out.extend(response_values(forward_logprobs(model, mb, temperature, precision), mb))
    return out
