"""GRPO shared-prompt forward (`trainer.shared_prefix`): run each distinct prompt of a micro-batch once.

In GRPO the n samples of a group share one prompt, yet a plain forward over prompt+response runs that
prompt n times. Here a padded micro-batch of b samples with u distinct prompts (found by their token
ids: identical ids give identical keys/values, so this is exact) runs in two decoder calls, both with
gradients:

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
`MicroBatch.mask` layout of `actors.forward.collate`, so the loss code (clip, TIS, KL, C01/C02
aggregation, multi-turn loss mask) is unchanged. Advantages keep using rollout group ids (case C04):
prompts are matched here only to share computation.

Falls back to the plain prompt+response forward (`actors.forward.forward_logprobs`), logged once per
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

from actors.forward import FAST_PATH_ARCHS, MicroBatch, autocast_context, batch_logprobs as plain_batch_logprobs
from actors.forward import collate, forward_logprobs, response_values
from orchestrator.algo import token_logprobs

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
    """None when the `Trainer` (actors/trainer.py) can use the shared-prompt forward, else why not.

    Reads trainer.cfg (TrainerConfig), trainer.model, trainer._moe (router loss, None if off), trainer.dp_size.
    """
    cfg = trainer.cfg
    if not cfg.shared_prefix:
        return "trainer.shared_prefix is false"
    if cfg.packing:
        return "trainer.packing is on (packed rows are used instead)"
    if getattr(trainer, "_moe", None) is not None:
        return "the MoE router loss needs router logits of every prompt+response token"
    if cfg.gradient_checkpointing:
        return "trainer.gradient_checkpointing: transformers turns the KV cache off in checkpointed layers"
    if trainer.dp_size > 1:
        return f"trainer.num_workers = {trainer.dp_size} FSDP2 ranks (not supported by this path)"
    return model_fallback_reason(trainer.model)


def enabled(trainer) -> bool:
    """Whether `trainer` uses the shared-prompt forward; decided on first call, a fallback logged once."""
    on = getattr(trainer, "_shared_prefix_on", None)
    if on is None:
        reason = trainer_fallback_reason(trainer)
        on = reason is None
        if not on and trainer.cfg.shared_prefix:
            log.warning("trainer.shared_prefix: using the plain prompt+response forward because %s", reason)
        trainer._shared_prefix_on = on
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
    forward per micro-batch): prompts by (length, first appearance), each prompt's samples by response
    length (little padding). The global loss normaliser makes the order irrelevant to the update."""
    first: dict[tuple, int] = {}
    for k, i in enumerate(idx):
        first.setdefault(tuple(prompt_ids[i]), k)
    return sorted(idx, key=lambda i: (len(prompt_ids[i]), first[tuple(prompt_ids[i])], len(response_ids[i])))


def shared_prefix_logprobs(model, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                           mask: torch.Tensor, temperature: float, precision: str = "fp32",
                           pad_id: int = 0) -> torch.Tensor:
    """Per-token logprobs [b, L-1] float32 laid out like `collate`'s `mask` (0 off it), differentiable.

    prompt_ids / response_ids: b non-empty token-id lists; mask: [b, L-1] bool, the `MicroBatch.mask`
    of `collate(prompt_ids, response_ids)` (row i has len(response_i) True positions, in order).
    Values equal `forward_logprobs` on that micro-batch up to float rounding (see the module doc for
    the two decoder calls). Raises ValueError for an empty prompt or response, or a mask whose row
    counts differ from the response lengths.
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
    device = next(model.parameters()).device
    uniq, inverse = distinct_prompts(prompt_ids)
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
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    with autocast_context(precision):
        out = decoder(input_ids=prompts, position_ids=torch.arange(P, device=device)[None].expand(len(uniq), P),
                      use_cache=True)
        last = out.last_hidden_state[torch.arange(len(uniq), device=device), plen.to(device) - 1]  # [u, H]
        cache = out.past_key_values
        cache.batch_select_indices(inv)  # [u, ...] -> [b, ...] rows, differentiable indexing
        hidden = decoder(input_ids=responses, attention_mask=attn, position_ids=position_ids,
                         past_key_values=cache, use_cache=True).last_hidden_state  # [b, R, H]
        scoring = torch.cat([last[inv][:, None], hidden[:, :-1]], dim=1)  # [b, R, H]: position k scores token k
        logits = head(scoring[valid])  # [N, V], response tokens only
    lp = token_logprobs(logits[None], responses[valid][None], temperature)[0]
    return torch.zeros(mask.shape, dtype=lp.dtype, device=device).masked_scatter(mask.to(device), lp)


def _right_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out


def micro_batch_logprobs(trainer, mb: MicroBatch, prompt_ids, response_ids,
                         router_logits: Optional[list] = None) -> torch.Tensor:
    """The trainer's differentiable logprobs [b, L-1] of one micro-batch `mb` (made from prompt_ids /
    response_ids): the shared-prompt forward when `enabled(trainer)` and some prompt repeats, else
    `forward_logprobs` (which also fills `router_logits` for MoE)."""
    if mb.segments is None and enabled(trainer) and worth_sharing(prompt_ids):
        return shared_prefix_logprobs(trainer.model, prompt_ids, response_ids, mb.mask, trainer.temperature,
                                      trainer.cfg.precision, trainer.pad_id)
    return forward_logprobs(trainer.model, mb, trainer.temperature, trainer.cfg.precision,
                            router_logits=router_logits)


@torch.no_grad()
def batch_logprobs(model, prompt_ids, response_ids, temperature: float, micro_batch_size: int,
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
    plain `actors.forward.batch_logprobs` (packed rows with trainer.packing)."""
    cfg = trainer.cfg
    if enabled(trainer):
        return batch_logprobs(trainer.model, prompt_ids, response_ids, trainer.temperature, cfg.micro_batch_size,
                              cfg.precision, trainer.pad_id)
    return plain_batch_logprobs(trainer.model, prompt_ids, response_ids, trainer.temperature, cfg.micro_batch_size,
                                cfg.precision, trainer.pad_id,
                                micro_batch_tokens=cfg.micro_batch_tokens if cfg.packing else None)
