"""The trainer's warm-up before step 1 (`trainer.warm_up`): the largest micro-batch the config allows, forward and
backward through the trainer's own loss path, and the optimizer's state, while the engines start.

Why: a CPU process touches its peak memory for the first time in its first steps, and every fresh page is a page
fault (on this project's CPU machine 8.8 s of a 23 s first step and 5.9 s of a 21 s second one were spent in
the kernel, against 0.2 s of a 13 s later step: benchmarks/malloc_tunables.py). With `run.glibc_tunables: auto`
(orchestrator/runtime/malloc_env.py) the heap keeps what the warm-up touched, so the real steps reuse it; and a config
whose largest micro-batch does not fit in memory fails at start, not at the first long batch hours in.

CPU trainers only: a trainer on a GPU skips it (CUDA's caching allocator already keeps device memory between
steps, and in a colocated run the engines measure the free device memory while they start, which a concurrent
warm-up would take from them).

The heap is laid out as a steady step finds it: the optimizer's state is created first (a steady step's state
was made in step 1, below that step's activations), then two forward/backward passes (the second accumulates
into the gradients, as a step's later micro-batches do), then the optimizer's update. With the state created
after the activations instead (the first warm-up, 2026-12-03), step 2 put its activations on fresh pages again:
step 2 took 24.5 s (8.0 s in the kernel) against a steady 13.5 s; with this order steps 1-4 take 13.1-14.9 s,
none in the kernel (benchmarks/RESULTS.md, "The warm-up's heap order").

Nothing of the training state changes: the optimizer steps with zero gradients and learning rate 0 (AdamW:
exp_avg and exp_avg_sq stay 0, the update and the decoupled weight decay are exact no-ops); Adam and AdamW keep
their state tensors, zeroed with step 0, which is what their first step would create (torch's lazy
initialisation), so the memory stays where it was touched; any other optimizer's state is emptied as before any
step. The gradients are dropped; torch's CPU RNG state is put back (`torch.random.fork_rng`); the LR schedule and
the trainer's step count are not touched.
"""
from __future__ import annotations

import time
import torch

from actors.model import prefix_share
from actors.model.forward import collate_micro_batch
from actors.model.policy_forward import policy_forward

# what torch's CPU allocator (c10 DefaultCPUAllocator) says when malloc fails
CPU_OUT_OF_MEMORY = ("DefaultCPUAllocator: can't allocate memory",)


def warm_up_sequences(micro_batch_size: int, packing: bool, micro_batch_tokens: int, prompt_len: int,
                      response_len: int) -> list[tuple[int, int]]:
    """(prompt, response) tokens of each sequence of the largest micro-batch: `micro_batch_size` padded rows of
    `prompt_len` + `response_len`, or one packed row of exactly `micro_batch_tokens` (trainer.packing): as many
    whole sequences as it holds (at least one), then one shorter sequence with the tokens left when they are at
    least 2 (a sequence needs a prompt and a response token). Raises ValueError for a size, budget or length
    below 1."""
    if min(micro_batch_size, micro_batch_tokens, prompt_len, response_len) < 1:
        raise ValueError(f"warm-up micro-batch: micro_batch_size={micro_batch_size}, micro_batch_tokens="
                         f"{micro_batch_tokens}, prompt_len={prompt_len} and response_len={response_len} must all "
                         f"be >= 1")
    if not packing:
        return [(prompt_len, response_len)] * micro_batch_size
    whole = max(micro_batch_tokens // (prompt_len + response_len), 1)
    rest = micro_batch_tokens - whole * (prompt_len + response_len)
    tail = [(min(prompt_len, rest - 1), rest - min(prompt_len, rest - 1))] if rest >= 2 else []
    return [(prompt_len, response_len)] * whole + tail


def warm_up(trainer, prompt_len: int, response_len: int, group_size: int = 1) -> dict[str, float]:
    """Run the warm-up on `trainer` (an actors/trainer Trainer; every rank of a sharded or context-parallel trainer
    at once, as they get the same micro-batch): the `warm_up_sequences(...)` of random token ids (int64; the
    longest prompt and response a step can get, tokens: orchestrator.memory.preflight.longest_sequence) collated
    as a step collates them, forward through `policy_forward` (precision's autocast, context parallelism,
    response-only logits) and backward twice, between two `touch_optimizer_state` (the first only for Adam and
    AdamW, whose state is kept). When the trainer uses the shared-prompt
    forward (actors/model/prefix_share.py), each run of `group_size` sequences (rollout.n, a GRPO group) shares
    its prompt, as in a step's micro-batch; otherwise every prompt is distinct. Returns {"trainer/warm_up_s":
    seconds; 0.0 when skipped on a GPU}. Raises ValueError for a length or group size below 1;
    torch.OutOfMemoryError naming the shape when it does not fit (torch's, or the CPU allocator's RuntimeError);
    what the forward or backward raise."""
    if min(prompt_len, response_len, group_size) < 1:
        raise ValueError(f"warm-up: prompt_len={prompt_len}, response_len={response_len} and group_size="
                         f"{group_size} must be >= 1")
    model = trainer.model
    if next(model.parameters()).device.type != "cpu":
        return {"trainer/warm_up_s": 0.0}
    t0 = time.perf_counter()
    cfg = trainer.cfg
    lengths = warm_up_sequences(cfg.micro_batch_size, cfg.packing, cfg.micro_batch_tokens, prompt_len, response_len)
    group = group_size if group_size > 1 and prefix_share.enabled(trainer) else 1
    generator = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    distinct = [torch.randint(0, vocab, (p,), generator=generator).tolist() for p, _ in lengths]
    prompts = [distinct[i // group][:p] for i, (p, _) in enumerate(lengths)]
    responses = [torch.randint(0, vocab, (r,), generator=generator).tolist() for _, r in lengths]
    optimizer = trainer.optimizer
    try:
        if keeps_zero_state(optimizer):
            touch_optimizer_state(optimizer)  # the state below the activations, as in a steady step
        for _ in range(2):  # the second accumulates into the gradients, as a step's later micro-batches do
            _forward_backward(trainer, prompts, responses)
    except RuntimeError as e:  # torch.OutOfMemoryError; the CPU allocator raises a plain RuntimeError
        if not isinstance(e, torch.OutOfMemoryError) and not any(m in str(e) for m in CPU_OUT_OF_MEMORY):
            raise
        shape = (f"a packed row of {cfg.micro_batch_tokens} tokens ({len(lengths)} sequences)" if cfg.packing else
                 f"a micro-batch of {len(lengths)} sequences of {prompt_len} + {response_len} tokens")
        raise torch.OutOfMemoryError(f"trainer warm-up: {shape}, the largest the config allows, with the optimizer "
                                     f"state, does not fit: {e}") from e
    touch_optimizer_state(optimizer)
    return {"trainer/warm_up_s": time.perf_counter() - t0}


def _forward_backward(trainer, prompts: list[list[int]], responses: list[list[int]]) -> None:
    """One micro-batch collated as a step collates it, through `policy_forward` and backward; the CPU RNG (which
    dropout draws from) is forked, so the run's draws stay the same."""
    mb = collate_micro_batch(prompts, responses, trainer.cfg.packing, pad_id=trainer.pad_id)
    with torch.random.fork_rng(devices=[]):
        logprobs, entropy, _ = policy_forward(trainer, mb, prompts, responses)
        loss = logprobs.sum() + (entropy.sum() if entropy is not None and entropy.requires_grad else 0.0)
        loss.backward()


def keeps_zero_state(optimizer: torch.optim.Optimizer) -> bool:
    """True for torch's Adam and AdamW (AdamW subclasses Adam): the state their first step creates is zeros
    (exp_avg, exp_avg_sq, max_exp_avg_sq) and a step count of 0, so a zeroed state is a new one."""
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW)  # a subclass may initialise otherwise


def touch_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Allocate and touch the optimizer's state, then leave the optimizer as before its first step: one step with
    every gradient zero (a parameter without one gets a zero gradient) and every group's learning rate 0 (its
    other hyperparameters, the parameters and the schedule untouched); then Adam's and AdamW's state tensors are
    zeroed, step counts included (`keeps_zero_state`), any other optimizer's state emptied; the gradients set to
    None."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.zero_()
            elif p.requires_grad:
                p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0 if not isinstance(group["lr"], torch.Tensor) else torch.zeros_like(group["lr"])
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        if keeps_zero_state(optimizer):
            _zero_state(optimizer)
        else:
            optimizer.state.clear()
        optimizer.zero_grad(set_to_none=True)


def _zero_state(optimizer: torch.optim.Optimizer) -> None:
    """Every tensor of the optimizer's state set to 0 in place (its memory stays where it was touched)."""
    for value in (v for state in optimizer.state.values() for v in state.values()):
        if isinstance(value, torch.Tensor):
            value.zero_()
