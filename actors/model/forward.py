"""Policy forward passes shared by the trainer and the reference model (plain torch, no Ray).

A trajectory batch arrives as lists (prompt ids, response ids, per-token values). `collate` right-pads
one micro-batch into tensors in *shifted* coordinates: position p of a [b, L-1] tensor scores the
token at p + 1, so the response tokens of sample i sit at positions len(prompt_i)-1 ...
len(prompt_i)+len(response_i)-2. Per-token values given per response token (rollout logprobs,
reference logprobs) are scattered to the same positions, so every tensor lines up with `mask`.

`collate_packed` lays several sequences end to end in one row instead (sequence packing, case C11):
position ids restart at 0 per sequence and the model gets no attention mask, so transformers builds the
block-diagonal causal mask from the position ids (sdpa/eager, `masking_utils.find_packed_sequence_indices`)
or runs varlen flash attention (`_is_packed_sequence`, batch of one row). A boundary position (the last
token of one sequence "predicting" the first of the next) is never in `mask`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from orchestrator.algo import EntropySink, position_ids_from_attention_mask, token_logprobs
from orchestrator.algo.packing import pack_first_fit_decreasing, packed_position_ids, token_occupancy
from orchestrator.algo.sampler_support import Sampling


@dataclass
class MicroBatch:
    """Tensors of one micro-batch. input_ids/attention_mask: [b, L] int64; the rest [b, L-1]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor  # int64, input_ids[:, 1:]
    mask: torch.Tensor  # bool, True on response tokens
    values: dict[str, torch.Tensor]  # float32 per-token values scattered onto mask positions
    # packed rows only (collate_packed): [1, L] int64 position ids restarting per sequence, and per sample
    # (start, n) of its response in shifted coordinates of the row; None for padded micro-batches
    position_ids: Optional[torch.Tensor] = None
    segments: Optional[list[tuple[int, int]]] = None


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


def collate_micro_batch(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], packing: bool,
                        per_token: Optional[dict[str, Sequence[Sequence[float]]]] = None,
                        pad_id: int = 0) -> MicroBatch:
    """A training micro-batch as trainer.packing lays it out: `collate_packed` (one packed row) or `collate`."""
    if packing:
        return collate_packed(prompt_ids, response_ids, per_token)
    return collate(prompt_ids, response_ids, per_token, pad_id)


def collate_packed(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                   per_token: Optional[dict[str, Sequence[Sequence[float]]]] = None) -> MicroBatch:
    """Lay the samples end to end in ONE row, without padding (sequence packing, case C11).

    input_ids / attention_mask (all ones) / position_ids: [1, L], L = sum of prompt + response lengths;
    targets / mask / values: [1, L-1] in shifted coordinates as in `collate`. Sample i's response sits at
    shifted positions o_i + len(prompt_i) - 1 ... o_i + len(prompt_i) + len(response_i) - 2 (o_i: its
    offset in the row), recorded in `segments[i] = (start, len(response_i))`. The boundary position
    o_i + len_i - 1 (last token of sample i scoring the first of sample i+1) is outside every segment.

    Raises ValueError when there is no sample, a prompt or a response is empty, or a per-token list's
    length differs from its response.
    """
    per_token = per_token or {}
    b = len(prompt_ids)
    if b == 0 or b != len(response_ids):
        raise ValueError(f"collate_packed: got {b} prompts and {len(response_ids)} responses")
    ids: list[int] = []
    segments: list[tuple[int, int]] = []
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        if len(r) == 0 or len(p) == 0:
            raise ValueError(f"collate_packed: sample {i} has an empty {'response' if len(r) == 0 else 'prompt'}")
        segments.append((len(ids) + len(p) - 1, len(r)))
        ids.extend(p)
        ids.extend(r)
    input_ids = torch.tensor([ids], dtype=torch.long)
    mask = torch.zeros((1, len(ids) - 1), dtype=torch.bool)
    values = {k: torch.zeros((1, len(ids) - 1), dtype=torch.float32) for k in per_token}
    for i, (start, n) in enumerate(segments):
        mask[0, start : start + n] = True
        for k, rows in per_token.items():
            if len(rows[i]) != n:
                raise ValueError(f"collate_packed: {k} of sample {i} has {len(rows[i])} values for {n} response tokens")
            values[k][0, start : start + n] = torch.tensor(rows[i], dtype=torch.float32)
    position_ids = packed_position_ids([len(p) + len(r) for p, r in zip(prompt_ids, response_ids)])[None]
    return MicroBatch(input_ids, torch.ones_like(input_ids), input_ids[:, 1:], mask, values, position_ids, segments)


def split_micro_batches(lengths: Sequence[int], micro_batch_size: int,
                        micro_batch_tokens: Optional[int] = None) -> tuple[list[list[int]], float]:
    """Group sequences into micro-batches; returns (groups of indices into `lengths`, token occupancy).

    Padded (micro_batch_tokens None): consecutive groups of `micro_batch_size`, occupancy = real tokens /
    sum over groups of (group size * its longest length). Packed: first-fit-decreasing rows of at most
    `micro_batch_tokens` tokens, occupancy = real tokens / (rows * micro_batch_tokens). Raises ValueError
    for an empty `lengths`, a size or budget < 1, or a sequence longer than the budget.
    """
    if not lengths:
        raise ValueError("split_micro_batches: no sequences")
    if micro_batch_tokens is not None:
        groups = pack_first_fit_decreasing(lengths, micro_batch_tokens)
        return groups, token_occupancy(sum(lengths), len(groups), micro_batch_tokens)
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size: must be >= 1, got {micro_batch_size}")
    groups = [list(range(s, min(s + micro_batch_size, len(lengths)))) for s in range(0, len(lengths), micro_batch_size)]
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return groups, token_occupancy(sum(lengths), 1, padded)


def per_sequence(t: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, MicroBatch]:
    """Re-lay a packed row's per-token tensors one sequence per row, as `policy_loss` aggregates per row.

    t: [1, L-1] (e.g. differentiable logprobs of `forward_logprobs`). Returns (t' [n, R], mb') with
    R = the longest response, t'[i, :len(response_i)] = t over sample i's segment and 0 after it; mb'
    has mask [n, R] and values [n, R] laid out the same way, `segments` None, and keeps the packed row's
    input_ids / attention_mask / position_ids. Gradients flow through t'. Raises ValueError when `mb`
    is not packed or `t` is not shaped like its mask.
    """
    if mb.segments is None:
        raise ValueError("per_sequence: the micro-batch is not packed (segments is None)")
    if t.shape != mb.mask.shape:
        raise ValueError(f"per_sequence: t: shape {tuple(t.shape)} != the packed row's mask {tuple(mb.mask.shape)}")
    starts = torch.tensor([s for s, _ in mb.segments], dtype=torch.long)
    counts = torch.tensor([n for _, n in mb.segments], dtype=torch.long)
    offs = torch.arange(int(counts.max()), dtype=torch.long)
    mask = offs[None] < counts[:, None]  # [n, R]
    cols = torch.where(mask, starts[:, None] + offs[None], starts[:, None])  # any valid column where masked out

    def gather(x: torch.Tensor) -> torch.Tensor:
        m, c = mask.to(x.device), cols.to(x.device)
        return torch.where(m, x[0][c], torch.zeros((), dtype=x.dtype, device=x.device))

    values = {k: gather(v) for k, v in mb.values.items()}
    out = MicroBatch(mb.input_ids, mb.attention_mask, mb.targets, mask, values, mb.position_ids, None)
    return gather(t), out


LOSS_MASK = "loss_mask"  # per-token value: 1 = trained (policy-sampled id), 0 = not (multi-turn observation id)


def apply_loss_mask(mb: MicroBatch) -> MicroBatch:
    """Restrict `mb.mask` to trained response ids: positions whose ``values["loss_mask"]`` is 0 become False.

    Multi-turn trajectories (orchestrator/rollout/multiturn.py) carry observation and template ids
    inside the response; they were not sampled by the policy, so they must not enter the loss, the
    loss-normaliser token counts, the KL term or the logprob-gap metrics, all of which read `mask`.
    Works on padded (`collate`) and per-sequence (`per_sequence`) micro-batches, whose values carry the
    mask scattered like every other per-token value. No "loss_mask" value: `mb` is returned unchanged.
    """
    if LOSS_MASK not in mb.values:
        return mb
    keep = mb.values[LOSS_MASK].to(mb.mask.device) > 0.5
    return MicroBatch(mb.input_ids, mb.attention_mask, mb.targets, mb.mask & keep, mb.values, mb.position_ids,
                      mb.segments)


def autocast_context(precision: str, device: torch.device | str):
    """bf16 autocast on `device` (the model's: a CPU model on a GPU host gets CPU autocast, not CUDA's, which would
    leave its matmuls in fp32) for "bf16-autocast", and for "fp8" on a GPU (the layers outside the FP8 linears,
    actors/trainer/fp8.py); a no-op for "fp32" and for "fp8" on the CPU (fp32 around the FP8 matmuls)."""
    device_type = torch.device(device).type
    if precision == "bf16-autocast" or (precision == "fp8" and device_type == "cuda"):
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# logits = lm_head(final hidden state), nothing else: safe to project only the response positions
FAST_PATH_ARCHS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                             "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM"})


def forward_logprobs(model, mb: MicroBatch, temperature: Sampling, precision: str = "fp32",
                     router_logits: Optional[list] = None, entropy: Optional[EntropySink] = None) -> torch.Tensor:
    """Logprobs [b, L-1] float32 of each next token under `model`, with the sampling temperature
    applied (log_softmax(logits / T), case C03); position ids from the attention mask (case C10).

    Only positions in `mb.mask` are scored (0 elsewhere). For architectures whose logits are a plain
    linear map of the last hidden state (`FAST_PATH_ARCHS`), the output projection runs on response
    positions alone, which saves its cost and the [b, L, V] logits on prompt tokens; every other
    model (logit scaling or soft-capping: Gemma, Granite, Cohere, ...) goes through its own forward.
    A mixture-of-experts model given a `router_logits` list runs with `output_router_logits=True` and
    appends each MoE layer's router logits ([b * L, E], rows in `mb.input_ids` order) to it. Given an
    `entropy` sink, the token entropy of the masked positions is computed from the same logits (no second
    forward; orchestrator/algo/entropy.py) and left in `entropy.value` [b, L-1].
    """
    extra = {"output_router_logits": True} if router_logits is not None else {}
    device = next(model.parameters()).device
    ids, attn, mask = mb.input_ids.to(device), mb.attention_mask.to(device), mb.mask.to(device)
    if mb.position_ids is not None:  # packed row: no mask, so transformers separates sequences by position ids
        position_ids, attn = mb.position_ids.to(device), None
    else:
        position_ids = position_ids_from_attention_mask(mb.attention_mask).to(device)
    targets = mb.targets.to(device)
    with autocast_context(precision, device):
        if type(model).__name__ not in FAST_PATH_ARCHS:
            out = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False, **extra)
            _collect_router_logits(out, router_logits)
            if entropy is not None:
                entropy.record(out.logits[:, :-1][mask], mask, temperature)
            return token_logprobs(out.logits[:, :-1], targets, temperature).masked_fill(~mask, 0.0)
        out = model.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                                  **extra)
        _collect_router_logits(out, router_logits)
        hidden = out.last_hidden_state
        logits = model.get_output_embeddings()(hidden[:, :-1][mask])  # [N, V] response positions only
    if entropy is not None:
        entropy.record(logits, mask, temperature)
    lp = token_logprobs(logits[None], targets[mask][None], temperature)[0]
    return torch.zeros(mask.shape, dtype=lp.dtype, device=device).masked_scatter(mask, lp)


def _collect_router_logits(out, sink: Optional[list]) -> None:
    if sink is not None:
        if getattr(out, "router_logits", None) is None:
            raise ValueError(f"{type(out).__name__} has no router_logits: the model is not a mixture of experts")
        sink.extend(out.router_logits)


def response_values(t: torch.Tensor, mb: MicroBatch) -> list[list[float]]:
    """Inverse of collate's (or collate_packed's) scatter: the per-response-token values of `t` [b, L-1]
    as one list per sample."""
    if mb.segments is not None:
        row = t[0].tolist()
        return [row[s : s + n] for s, n in mb.segments]
    return [t[i][mb.mask[i]].tolist() for i in range(t.shape[0])]


@torch.no_grad()
def batch_logprobs(model, prompt_ids, response_ids, temperature: Sampling, micro_batch_size: int,
                   precision: str = "fp32", pad_id: int = 0,
                   micro_batch_tokens: Optional[int] = None, forward=forward_logprobs) -> list[list[float]]:
    """Response-token logprobs of every sample (no gradient), [B][len(response_i)], computed in padded
    micro-batches of `micro_batch_size` sequences, or, when `micro_batch_tokens` is given, in packed rows
    of at most that many tokens (first-fit decreasing; ValueError if one sequence is longer). `forward`:
    `forward_logprobs` or one with its signature (the context-parallel forward, actors/model/context_parallel.py)."""
    if micro_batch_tokens is not None:
        lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
        result: list = [None] * len(prompt_ids)
        for row in pack_first_fit_decreasing(lengths, micro_batch_tokens):
            mb = collate_packed([prompt_ids[i] for i in row], [response_ids[i] for i in row])
            for i, lp in zip(row, response_values(forward(model, mb, temperature, precision), mb)):
                result[i] = lp
        return result
    out: list[list[float]] = []
    for s in range(0, len(prompt_ids), micro_batch_size):
        mb = collate(prompt_ids[s : s + micro_batch_size], response_ids[s : s + micro_batch_size], pad_id=pad_id)
        out.extend(response_values(forward(model, mb, temperature, precision), mb))
    return out


class _LogSoftmaxRows:
    """A logits sink for `forward_logprobs` (the `entropy` slot's interface): keeps the scored positions' whole
    log_softmax rows [N, V] float32 (temperature 1), for the weight-sync probe's full-distribution check."""

    value: Optional[torch.Tensor] = None

    def record(self, logits: torch.Tensor, mask: torch.Tensor, temperature: Sampling) -> None:
        self.value = torch.log_softmax(logits.detach().float(), dim=-1).cpu()


@torch.no_grad()
def probe_scores(model, prompt_ids: list[int], continuation_ids: list[int], precision: str, pad_id: int,
                 rows: bool = False):
    """The trainer's side of the weight-sync probe (orchestrator/weight_sync/probe.py), in eval mode (no dropout, no
    draw from the training RNG), temperature 1 as vLLM's prompt logprobs: `ProbeScores` with the continuation's
    logprobs [len(continuation_ids)] and, with `rows`, the whole log_softmax rows [len(continuation_ids), V] float32
    at those positions (the full-distribution check)."""
    from orchestrator.weight_sync.probe import ProbeScores

    training, sink = model.training, (_LogSoftmaxRows() if rows else None)
    model.eval()
    try:
        mb = collate([prompt_ids], [continuation_ids], pad_id=pad_id)
        logprobs = response_values(forward_logprobs(model, mb, 1.0, precision, entropy=sink), mb)[0]
    finally:
        model.train(training)
    return ProbeScores(logprobs, rows=sink.value if sink is not None else None)
