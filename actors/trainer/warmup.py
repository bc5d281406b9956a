"""The trainer's warm-up before step 1 (`trainer.warm_up`): the largest micro-batch the config allows, forward and
backward through the trainer's own loss path, and the optimizer's state, while the engines start.

Why: a CPU process touches its peak memory for the first time in its first steps, and every fresh page is a page
fault (on this project's CPU machine 8.8 s of a 23 s first step and 5.9 s of a 21 s second one were spent in
the kernel, against 0.2 s of a 13 s later step: benchmarks/malloc_tunables.py). With `run.glibc_tunables: auto`
(orchestrator/malloc_env.py) the heap keeps what the warm-up touched, so the real steps reuse it; and a config
whose largest micro-batch does not fit in memory fails at start, not at the first long batch hours in.

CPU trainers only: a trainer on a GPU skips it (CUDA's caching allocator already keeps device memory between
steps, and in a colocated run the engines measure the free device memory while they start, which a concurrent
warm-up would take from them).

Nothing of the training state changes: the optimizer steps once with zero gradients and learning rate 0 (AdamW:
exp_avg and exp_avg_sq stay 0, the update and the decoupled weight decay are exact no-ops), then its state is
emptied as before any step; the gradients are dropped; torch's CPU RNG state is put back (`torch.random.fork_rng`);
the LR schedule and the trainer's step count are not touched.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from actors.trainer.forward import collate, collate_packed
from actors.trainer.policy_forward import policy_forward


def warm_up_lengths(cfg, longest_prompt: Optional[int] = None) -> tuple[int, int]:
    """(prompt, response) tokens of the longest sequence a step can get: the trainer's warm-up shape
    (trainer.warm_up). `longest_prompt`: the data's longest rendered prompt (None: data.max_prompt_tokens).
    Single-turn: rollout.max_new_tokens of response; multi-turn: a trajectory of env.max_tokens ids in all, every
    one after the first prompt scored (turns and observations)."""
    prompt = max(cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt, 1)
    if cfg.env.name:
        return prompt, max(cfg.env.max_tokens - prompt, 1)
    return prompt, cfg.rollout.max_new_tokens


def warm_up_rows(micro_batch_size: int, packing: bool, micro_batch_tokens: int, seq_len: int) -> int:
    """Sequences of `seq_len` tokens in the largest micro-batch: `micro_batch_size` padded rows, or as many as one
    packed row of `micro_batch_tokens` holds (at least one; trainer.packing). Raises ValueError for a size,
    budget or length below 1."""
    if min(micro_batch_size, micro_batch_tokens, seq_len) < 1:
        raise ValueError(f"warm-up micro-batch: micro_batch_size={micro_batch_size}, micro_batch_tokens="
                         f"{micro_batch_tokens} and the sequence length {seq_len} must all be >= 1")
    return max(micro_batch_tokens // seq_len, 1) if packing else micro_batch_size


def warm_up(trainer, prompt_len: int, response_len: int) -> dict[str, float]:
    """Run the warm-up on `trainer` (an actors/trainer Trainer; every rank of a sharded or context-parallel trainer
    at once, as they get the same micro-batch): `warm_up_rows(...)` sequences of `prompt_len` + `response_len`
    random token ids (int64; the longest prompt and response a step can get, tokens) collated as a step collates
    them, one forward through `policy_forward` (precision's autocast, context parallelism, response-only logits)
    and one backward, then `touch_optimizer_state`. Returns {"trainer/warm_up_s": seconds; 0.0 when skipped on
    a GPU}. Raises ValueError for a length below 1, torch.OutOfMemoryError naming the shape when it does not fit,
    and what the forward or backward raise."""
    if prompt_len < 1 or response_len < 1:
        raise ValueError(f"warm-up: prompt_len={prompt_len} and response_len={response_len} must be >= 1")
    model = trainer.model
    if next(model.parameters()).device.type != "cpu":
        return {"trainer/warm_up_s": 0.0}
    t0 = time.perf_counter()
    cfg = trainer.cfg
    rows = warm_up_rows(cfg.micro_batch_size, cfg.packing, cfg.micro_batch_tokens, prompt_len + response_len)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (rows, prompt_len + response_len), generator=torch.Generator().manual_seed(0))
    prompts, responses = ids[:, :prompt_len].tolist(), ids[:, prompt_len:].tolist()
    mb = collate_packed(prompts, responses) if cfg.packing else collate(prompts, responses, pad_id=trainer.pad_id)
    try:
        with torch.random.fork_rng(devices=[]):  # dropout draws from the CPU RNG: the run's draws stay the same
            logprobs, entropy, _ = policy_forward(trainer, mb, prompts, responses)
            loss = logprobs.sum() + (entropy.sum() if entropy is not None and entropy.requires_grad else 0.0)
            loss.backward()
    except torch.OutOfMemoryError as e:
        raise torch.OutOfMemoryError(f"trainer warm-up: a micro-batch of {rows} sequences of {prompt_len} + "
                                     f"{response_len} tokens (the largest the config allows) does not fit: {e}") from e
    touch_optimizer_state(trainer.optimizer)
    return {"trainer/warm_up_s": time.perf_counter() - t0}


def touch_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Allocate and touch the optimizer's state, then leave the optimizer as before its first step: one step with
    every gradient zeroed and every group's learning rate 0 (its other hyperparameters, the parameters and the
    schedule untouched), then the state emptied and the gradients set to None."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.zero_()
    lrs = [group["lr"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0 if not isinstance(group["lr"], torch.Tensor) else torch.zeros_like(group["lr"])
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        optimizer.state.clear()
        optimizer.zero_grad(set_to_none=True)
