"""The trainer's warm-up before step 1 (`trainer.warm_up`): the largest micro-batch the config allows, forward and
backward, and the optimizer's state, while the engines start.

Why: a process touches its peak memory for the first time in its first steps, and every fresh page is a page
fault (on this project's CPU machine 8.8 s of a 23 s first step and 5.9 s of a 21 s second one were spent in
the kernel, against 0.2 s of a 13 s later step: benchmarks/malloc_tunables.py). With `run.glibc_tunables: auto`
(orchestrator/malloc_env.py) the heap keeps what the warm-up touched, so the real steps reuse it; and a config
whose largest micro-batch does not fit in memory fails at start, not at the first long batch hours in.

Nothing of the training state changes: the optimizer steps once with zero gradients and learning rate 0 (AdamW:
exp_avg and exp_avg_sq stay 0, the update and the decoupled weight decay are exact no-ops), then its state is
emptied as before any step; the gradients are dropped; torch's RNG state is put back; the LR schedule and the
trainer's step count are not touched.
"""
from __future__ import annotations

import time

import torch


def warm_up_shape(micro_batch_size: int, max_len: int, packing: bool, micro_batch_tokens: int) -> tuple[int, int]:
    """(rows, tokens) of the largest micro-batch: `micro_batch_size` rows of `max_len` tokens padded, one row of
    `micro_batch_tokens` packed (trainer.packing). Raises ValueError for a non-positive size."""
    rows, length = (1, micro_batch_tokens) if packing else (micro_batch_size, max_len)
    if rows < 1 or length < 1:
        raise ValueError(f"warm-up micro-batch of {rows} rows x {length} tokens: both must be >= 1")
    return rows, length


def warm_up(trainer, max_len: int) -> dict[str, float]:
    """Run the warm-up on `trainer` (an actors/trainer Trainer; every rank of a sharded trainer at once): one
    forward and backward of `warm_up_shape(...)` random token ids (int64), then `touch_optimizer_state`.
    `max_len`: the longest sequence the run can train on, tokens (prompt + response). Returns
    {"trainer/warm_up_s": seconds}. Raises what the forward or backward raise (an out-of-memory error names the
    shape that does not fit)."""
    t0 = time.perf_counter()
    cfg = trainer.cfg
    rows, length = warm_up_shape(cfg.micro_batch_size, max_len, cfg.packing, cfg.micro_batch_tokens)
    rng = torch.get_rng_state()
    model = trainer.model
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0)).to(device)
    try:
        logits = model(input_ids=ids).logits
        # float32 log-softmax over the vocabulary: the loss's largest temporaries (orchestrator/algo/logprobs.py)
        torch.log_softmax(logits.float(), dim=-1).mean().backward()
        del logits
    except torch.OutOfMemoryError as e:
        raise torch.OutOfMemoryError(f"trainer warm-up: a micro-batch of {rows} x {length} tokens (the largest the "
                                     f"config allows) does not fit: {e}") from e
    touch_optimizer_state(trainer.optimizer)
    torch.set_rng_state(rng)
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
