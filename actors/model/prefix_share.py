"""GRPO shared-prompt forward (`trainer.shared_prefix`): run each distinct prompt of a micro-batch once.

In GRPO the n samples of a group share one prompt, yet a plain forward over prompt+response runs that
prompt n times. Here a padded micro-batch of b samples with u distinct prompts (found by their token
ids: identical ids give identical keys/values, so this is exact) runs each distinct prompt once, with
gradients, in one of two layouts (`choose_layout` picks the one with fewer FLOPs):

"row" (one decoder call, no padding): one row holding each distinct prompt followed by the responses
of its samples, T = sum of distinct prompt lengths + sum of response lengths tokens; position ids
restart per prompt (0..len-1) and continue per response (len(prompt) + 0..len-1); a 4-D mask
[1, 1, T, T] (`row_mask`: a response token sees its prompt and its own earlier tokens) goes to the
model as is (transformers passes 4-D masks through; bool for sdpa, additive float for eager). No KV
cache, no padding, one embedding / decoder / LM-head call. Cost: T^2 attention pairs, so very long
responses go to "cache". On the demo batch (benchmarks/RESULTS.md, issue 7) it removes the response
padding (computed tokens 0.62x -> 0.46x of the plain path's) and the second decoder call: a full
train_step 1.77x faster than plain by CPU time, against 1.40x for "cache" (1 torch thread).

"cache" (two decoder calls):

1. the u distinct prompts, right-padded to [u, P], `use_cache=True`. No attention mask is needed: a
   real prompt token only attends to earlier real tokens (causal), and a pad only to real tokens and
   earlier pads, so no query row is fully masked. The hidden state at each prompt's last real
   position scores the first response token.
2. the cache rows gathered to the b samples (`DynamicCache.batch_select_indices`, an indexing op that
   keeps the autograd graph back to step 1), then the responses [b, R] right-padded with
   attention_mask = [prompt pad mask gathered to b, response mask] ([b, P + R]) and position ids
   len(prompt_i) + 0..R-1. transformers builds the causal mask from cache slots (query j of the
   response sits at slot P + j, `Cache.get_query_offset`), so the 2-D mask hides the pad slots
   between a short prompt and its response; positions go to RoPE only. The hidden state at response
   position k scores response token k + 1.

Only the response-scoring hidden states go through the output projection (the LM head), and the
per-token logprobs (`token_logprobs`, log_softmax(logits / T), case C03) are scattered onto the
`MicroBatch.mask` layout of `actors.model.forward.collate`, so the loss code (clip, TIS, KL, C01/C02
aggregation, multi-turn loss mask) is unchanged. Advantages keep using rollout group ids (case C04):
prompts are matched here only to share computation.

Falls back to the plain prompt+response forward (`actors.model.forward.forward_logprobs`), logged once per
trainer, when: trainer.packing is on (packed rows have no per-sample prompt to share), the MoE router
loss is on (it needs router logits of every token), gradient checkpointing is on (transformers turns the
KV cache off in checkpointed training layers), the trainer has D > 1 FSDP2 ranks (the sharded root is
not called by this path; not verified), or the model is not in `FAST_PATH_ARCHS` (logit scaling or
soft-capping) or uses sliding-window attention. A micro-batch whose prompts are all distinct also takes
the plain forward (nothing to share).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from actors.model.forward import FAST_PATH_ARCHS, MicroBatch, autocast_context, batch_logprobs as plain_batch_logprobs
from actors.model.forward import collate, forward_logprobs, response_values
from orchestrator.algo import EntropySink, token_logprobs
from orchestrator.algo.sampler_support import Sampling

log = logging.getLogger(__name__)


def model_fallback_reason(model) -> Optional[str]:
    """None when `model`'s decoder + LM head can run the shared-prompt forward, else why not (a string)."""
    name = type(model).__name__
    if name not in FAST_PATH_ARCHS:
        return f"{name} is not one of the plain-LM-head architectures {sorted(FAST_PATH_ARCHS)}"
    cfg = model.config
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        sliding = any(t != "full_attention" for t in layer_types)
    else:
        sliding = getattr(cfg, "sliding_window", None) is not None
    if sliding:
        return f"{name} uses sliding-window attention"
    return None


def trainer_fallback_reason(trainer) -> Optional[str]:
    """None when the `Trainer` (actors/trainer/trainer.py) can use the shared-prompt forward, else why not.

    Reads trainer.cfg (TrainerConfig), trainer.model, trainer.router_aux (router loss, None if off), trainer.dp_size.
    """
    cfg = trainer.cfg
    if not cfg.shared_prefix:
        return "trainer.shared_prefix is false"
    if cfg.packing:
        return "trainer.packing is on (packed rows are used instead)"
    if getattr(trainer, "router_aux", None) is not None:
        return "the MoE router loss needs router logits of every prompt+response token"
    if cfg.gradient_checkpointing:
        return "trainer.gradient_checkpointing: transformers turns the KV cache off in checkpointed layers"
    if trainer.dp_size > 1:
        return f"trainer.num_workers = {trainer.dp_size} FSDP2 ranks (not supported by this path)"
    return model_fallback_reason(trainer.model)


def enabled(trainer) -> bool:
    """Whether `trainer` uses the shared-prompt forward; decided on first call, a fallback logged once."""
    on = getattr(trainer, "shared_prefix_on", None)
    if on is None:
        reason = trainer_fallback_reason(trainer)
        on = reason is None
        if not on and trainer.cfg.shared_prefix:
            log.warning("trainer.shared_prefix: using the plain prompt+response forward because %s", reason)
        trainer.shared_prefix_on = on
    return on


def distinct_prompts(prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """(the u distinct prompts in first-appearance order, index into them for each of the b samples)."""
    index: dict[tuple, int] = {}
    inverse = [index.setdefault(tuple(p), len(index)) for p in prompt_ids]
    return [list(p) for p in index], inverse


def worth_sharing(prompt_ids: Sequence[Sequence[int]]) -> bool:
    """True when at least two samples share a prompt (otherwise the plain forward does the same work)."""
    return len({tuple(p) for p in prompt_ids}) < len(prompt_ids)


def order_by_prompt(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                    idx: Sequence[int]) -> list[int]:
    """`idx` reordered so that samples with the same prompt sit side by side (and so share one prompt
    forward per micro-batch): prompt groups by their mean sequence length (prompt + response), then first
    appearance; each group's samples by response length. Little padding either way: with distinct prompts
    (groups of one) this is the plain length sort. The global loss normaliser makes the order irrelevant
    to the update."""
    first: dict[tuple, int] = {}
    total: dict[tuple, list[int]] = {}
    for k, i in enumerate(idx):
        key = tuple(prompt_ids[i])
        first.setdefault(key, k)
        total.setdefault(key, []).append(len(prompt_ids[i]) + len(response_ids[i]))
    mean = {key: sum(v) / len(v) for key, v in total.items()}
    return sorted(idx, key=lambda i: (mean[tuple(prompt_ids[i])], first[tuple(prompt_ids[i])], len(response_ids[i])))


LAYOUTS = ("auto", "row", "cache")
ROW_ATTENTION = frozenset({"sdpa", "eager"})  # attention implementations that take a custom 4-D mask


def shared_prefix_logprobs(model, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                           mask: torch.Tensor, temperature: Sampling, precision: str = "fp32",
                           pad_id: int = 0, layout: str = "auto",
                           entropy: Optional[EntropySink] = None) -> torch.Tensor:
    """Per-token logprobs [b, L-1] float32 laid out like `collate`'s `mask` (0 off it), differentiable.

    prompt_ids / response_ids: b non-empty token-id lists; mask: [b, L-1] bool, the `MicroBatch.mask`
    of `collate(prompt_ids, response_ids)` (row i has len(response_i) True positions, in order).
    layout: "row" (one unpadded row, prompts once, a prompt-tree mask), "cache" (two padded decoder
    calls over a gathered KV cache), or "auto" (`choose_layout`). Values equal `forward_logprobs` on
    that micro-batch up to float rounding (module doc). Raises ValueError for an empty prompt or
    response, a mask whose row counts differ from the response lengths, or an unknown layout (or
    "row" for an attention implementation outside `ROW_ATTENTION`). An `entropy` sink gets the token entropy
    [b, L-1] of the same logits (`forward_logprobs`).
    """
    b = len(prompt_ids)
    if b == 0 or b != len(response_ids):
        raise ValueError(f"shared_prefix_logprobs: got {b} prompts and {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids) or any(len(r) == 0 for r in response_ids):
        raise ValueError("shared_prefix_logprobs: every prompt and response needs at least one token")
    rlen = torch.tensor([len(r) for r in response_ids])
    if mask.dim() != 2 or mask.shape[0] != b or not torch.equal(mask.sum(1).cpu(), rlen):
        raise ValueError(f"shared_prefix_logprobs: mask {tuple(mask.shape)} does not hold the response lengths "
                         f"{rlen.tolist()} row by row")
    if layout not in LAYOUTS:
        raise ValueError(f"shared_prefix_logprobs: layout must be one of {LAYOUTS}, got {layout!r}")
    device = next(model.parameters()).device
    uniq, inverse = distinct_prompts(prompt_ids)
    if layout == "auto":
        layout = choose_layout(model.config, [len(p) for p in uniq], [len(r) for r in response_ids])
    with autocast_context(precision, device):
        if layout == "row":
            scoring, targets = _row_forward(model, uniq, inverse, response_ids, device)
        else:
            scoring, targets = _cache_forward(model, uniq, inverse, response_ids, rlen, device, pad_id)
        logits = model.get_output_embeddings()(scoring)  # [N, V], response tokens only
    if entropy is not None:
        entropy.record(logits, mask.to(device), temperature)
    lp = token_logprobs(logits[None], targets[None], temperature)[0]
    return torch.zeros(mask.shape, dtype=lp.dtype, device=device).masked_scatter(mask.to(device), lp)


def choose_layout(config, prompt_lens: Sequence[int], response_lens: Sequence[int]) -> str:
    """"row" or "cache", whichever needs fewer forward FLOPs per decoder layer (ties: "row").

    prompt_lens: the u distinct prompts' lengths; response_lens: the b responses' lengths. Per layer a
    token costs 2 * (projection + MLP weights) = 2 * (2 * H * (n_q + n_kv) * d + 3 * H * I) FLOPs and a
    (query, key) pair 4 * n_q * d (QK^T and PV; d = head_dim, H = hidden_size, I = intermediate_size,
    n_q / n_kv = attention / key-value heads, read from `config`). "row" runs T = sum of both lists tokens
    and T^2 pairs (a dense mask skips nothing); "cache" runs u * P + b * R tokens (P, R: the longest
    prompt and response, padding included) and u * P^2 + b * R * (P + R) pairs. Short rows (the demo's
    49-token prompts with 15-48-token responses) pick "row"; long responses (thousands of tokens)
    make T^2 dominate and pick "cache". "cache" whenever the attention implementation takes no 4-D mask.
    """
    if getattr(config, "_attn_implementation", None) not in ROW_ATTENTION:
        return "cache"
    H = config.hidden_size
    n_q = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_q
    d = getattr(config, "head_dim", None) or H // n_q
    inter = getattr(config, "intermediate_size", None) or 4 * H
    per_token, per_pair = 2 * (2 * H * (n_q + n_kv) * d + 3 * H * inter), 4 * n_q * d
    u, b, P, R = len(prompt_lens), len(response_lens), max(prompt_lens), max(response_lens)
    T = sum(prompt_lens) + sum(response_lens)
    row = T * per_token + T * T * per_pair
    cache = (u * P + b * R) * per_token + (u * P * P + b * R * (P + R)) * per_pair
    return "row" if row <= cache else "cache"


def row_layout(uniq: Sequence[Sequence[int]], inverse: Sequence[int],
               response_ids: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """One unpadded row: each distinct prompt, then the responses of its samples (T tokens in all).

    Returns int64 tensors ids / position_ids / prompt (index of the token's prompt) / sample (index of
    the token's sample, -1 on prompt tokens), each [T]; score [N] (row index of the hidden state that
    scores each response token, samples in input order, N = total response tokens: the prompt's last
    token for a response's first token, else the previous response token) and targets [N] (the ids).
    """
    ids, pos, prm, smp = [], [], [], []
    start = [0] * len(response_ids)  # row index of each response's first token
    prompt_end = []  # row index of each prompt's last token
    for j, p in enumerate(uniq):
        ids += list(p)
        pos += range(len(p))
        prm += [j] * len(p)
        smp += [-1] * len(p)
        prompt_end.append(len(ids) - 1)
        for i in (i for i, k in enumerate(inverse) if k == j):
            r = response_ids[i]
            start[i] = len(ids)
            ids += list(r)
            pos += range(len(p), len(p) + len(r))
            prm += [j] * len(r)
            smp += [i] * len(r)
    score, targets = [], []
    for i, r in enumerate(response_ids):
        score += [prompt_end[inverse[i]]] + list(range(start[i], start[i] + len(r) - 1))
        targets += list(r)
    t = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return {"ids": t(ids), "position_ids": t(pos), "prompt": t(prm), "sample": t(smp), "score": t(score),
            "targets": t(targets)}


def row_mask(prompt: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """[T, T] bool, True where query q may attend key k: k <= q in the row, same prompt, and k is a
    prompt token or a token of q's own sample (so each response sees its prompt and itself, causally)."""
    T = prompt.shape[0]
    causal = torch.ones(T, T, dtype=torch.bool, device=prompt.device).tril()
    same_prompt = prompt[:, None] == prompt[None, :]
    visible = (sample[None, :] < 0) | (sample[:, None] == sample[None, :])
    return causal & same_prompt & visible


def _row_forward(model, uniq, inverse, response_ids, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder call over `row_layout`'s row with `row_mask` as a 4-D mask (transformers passes a
    4-D mask through unchanged: bool for sdpa, additive float for eager). (scoring [N, H], targets [N])."""
    lay = {k: v.to(device) for k, v in row_layout(uniq, inverse, response_ids).items()}
    keep = row_mask(lay["prompt"], lay["sample"])[None, None]  # [1, 1, T, T]
    if model.config._attn_implementation == "eager":
        keep = torch.zeros(keep.shape, device=device).masked_fill(~keep, torch.finfo(torch.float32).min)
    hidden = model.get_decoder()(input_ids=lay["ids"][None], attention_mask=keep,
                                 position_ids=lay["position_ids"][None], use_cache=False).last_hidden_state
    return hidden[0, lay["score"]], lay["targets"]


def _cache_forward(model, uniq, inverse, response_ids, rlen, device, pad_id) -> tuple[torch.Tensor, torch.Tensor]:
    """The two padded decoder calls of the module doc ("cache" layout). (scoring [N, H], targets [N])."""
    plen = torch.tensor([len(p) for p in uniq])
    P, R = int(plen.max()), int(rlen.max())
    prompts = _right_pad(uniq, P, pad_id).to(device)
    responses = _right_pad(response_ids, R, pad_id).to(device)
    inv = torch.tensor(inverse, device=device)
    plen_b = plen.to(device)[inv]  # [b] prompt length of each sample
    attn = torch.cat([torch.arange(P, device=device)[None] < plen_b[:, None],
                      torch.arange(R, device=device)[None] < rlen.to(device)[:, None]], dim=1).long()  # [b, P+R]
    position_ids = plen_b[:, None] + torch.arange(R, device=device)[None]  # [b, R]
    valid = attn[:, P:].bool()  # [b, R] real response tokens
    decoder = model.get_decoder()
    out = decoder(input_ids=prompts, position_ids=torch.arange(P, device=device)[None].expand(len(uniq), P),
                  use_cache=True)
    last = out.last_hidden_state[torch.arange(len(uniq), device=device), plen.to(device) - 1]  # [u, H]
    cache = out.past_key_values
    cache.batch_select_indices(inv)  # [u, ...] -> [b, ...] rows, differentiable indexing
    hidden = decoder(input_ids=responses, attention_mask=attn, position_ids=position_ids,
                     past_key_values=cache, use_cache=True).last_hidden_state  # [b, R, H]
    scoring = torch.cat([last[inv][:, None], hidden[:, :-1]], dim=1)  # [b, R, H]: position k scores token k
    return scoring[valid], responses[valid]


def _right_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out


def micro_batch_logprobs(trainer, mb: MicroBatch, prompt_ids, response_ids,
                         router_logits: Optional[list] = None, entropy: Optional[EntropySink] = None) -> torch.Tensor:
    """The trainer's differentiable logprobs [b, L-1] of one micro-batch `mb` (made from prompt_ids /
    response_ids): the shared-prompt forward when `enabled(trainer)` and some prompt repeats, else
    `forward_logprobs` (which also fills `router_logits` for MoE). The layout is `choose_layout`'s unless
    `trainer.shared_prefix_layout` says otherwise (benchmarks, tests: "row" / "cache"; default "auto").
    An `entropy` sink gets the token entropy of the same logits."""
    if mb.segments is None and enabled(trainer) and worth_sharing(prompt_ids):
        return shared_prefix_logprobs(trainer.model, prompt_ids, response_ids, mb.mask, trainer.temperature,
                                      trainer.cfg.precision, trainer.pad_id,
                                      layout=trainer.shared_prefix_layout, entropy=entropy)
    return forward_logprobs(trainer.model, mb, trainer.temperature, trainer.cfg.precision,
                            router_logits=router_logits, entropy=entropy)


@torch.no_grad()
def batch_logprobs(model, prompt_ids, response_ids, temperature: Sampling, micro_batch_size: int,
                   precision: str = "fp32", pad_id: int = 0) -> list[list[float]]:
    """Response-token logprobs [B][len(response_i)] without gradient: samples ordered by prompt
    (`order_by_prompt`), padded micro-batches of `micro_batch_size`, each through the shared-prompt
    forward when a prompt repeats in it (else the plain forward); results in the input order."""
    n = len(prompt_ids)
    if n != len(response_ids):
        raise ValueError(f"batch_logprobs: got {n} prompts and {len(response_ids)} responses")
    order = order_by_prompt(prompt_ids, response_ids, range(n))
    out: list = [None] * n
    for s in range(0, n, micro_batch_size):
        part = order[s : s + micro_batch_size]
        prompts, responses = [prompt_ids[i] for i in part], [response_ids[i] for i in part]
        mb = collate(prompts, responses, pad_id=pad_id)
        if worth_sharing(prompts):
            lp = shared_prefix_logprobs(model, prompts, responses, mb.mask, temperature, precision, pad_id)
        else:
            lp = forward_logprobs(model, mb, temperature, precision)
        for i, v in zip(part, response_values(lp, mb)):
            out[i] = v
    return out


def trainer_batch_logprobs(trainer, prompt_ids, response_ids) -> list[list[float]]:
    """`Trainer.logprobs` / `_old_logprobs`: `batch_logprobs` above when `enabled(trainer)`, else the
    plain `actors.model.forward.batch_logprobs` (packed rows with trainer.packing)."""
    cfg = trainer.cfg
    if enabled(trainer):
        return batch_logprobs(trainer.model, prompt_ids, response_ids, trainer.temperature, cfg.micro_batch_size,
                              cfg.precision, trainer.pad_id)
    return plain_batch_logprobs(trainer.model, prompt_ids, response_ids, trainer.temperature, cfg.micro_batch_size,
                                cfg.precision, trainer.pad_id,
                                micro_batch_tokens=cfg.micro_batch_tokens if cfg.packing else None)
