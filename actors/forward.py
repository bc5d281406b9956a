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

    Raises ValueError when a prompt or a response is empty or a per-token list's length differs from its
    response.
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
        if len(p) == 0:  # the first response token needs a context token to be scored
            raise ValueError(f"collate: sample {i} has an empty prompt")
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


# logits = lm_head(final hidden state), nothing else: safe to project only the response positions
FAST_PATH_ARCHS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                             "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM"})


def forward_logprobs(model, mb: MicroBatch, temperature: float, precision: str = "fp32") -> torch.Tensor:
    """Logprobs [b, L-1] float32 of each next token under `model`, with the sampling temperature
    applied (log_softmax(logits / T), case C03); position ids from the attention mask (case C10).

    Only positions in `mb.mask` are scored (0 elsewhere). For architectures whose logits are a plain
    linear map of the last hidden state (`FAST_PATH_ARCHS`), the output projection runs on response
    positions alone, which saves its cost and the [b, L, V] logits on prompt tokens; every other
    model (logit scaling or soft-capping: Gemma, Granite, Cohere, ...) goes through its own forward.
    """
    device = next(model.parameters()).device
    position_ids = position_ids_from_attention_mask(mb.attention_mask).to(device)
    ids, attn, mask = mb.input_ids.to(device), mb.attention_mask.to(device), mb.mask.to(device)
    targets = mb.targets.to(device)
    with autocast_context(precision):
        if type(model).__name__ not in FAST_PATH_ARCHS:
            logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False).logits
            return token_logprobs(logits[:, :-1], targets, temperature).masked_fill(~mask, 0.0)
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=position_ids,
                                     use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(hidden[:, :-1][mask])  # [N, V] response positions only
    lp = token_logprobs(logits[None], targets[mask][None], temperature)[0]
    return torch.zeros(mask.shape, dtype=lp.dtype, device=device).masked_scatter(mask, lp)


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
