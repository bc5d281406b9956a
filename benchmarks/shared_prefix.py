"""Shared-prompt forward benchmark (`trainer.shared_prefix`, actors/model/prefix_share.py): a full
`Trainer.train_step` (forward + backward + AdamW step, fp32) with the prompt run once per group against
the plain prompt+response forward.

    .venv/bin/python benchmarks/shared_prefix.py                 # default model, 4 prompts x 8 samples
    .venv/bin/python benchmarks/shared_prefix.py --rounds 3 --threads 1
    .venv/bin/python benchmarks/shared_prefix.py --profile       # torch profile of one micro-batch

The batch is the demo's (configs/grpo_arith_cpu.yaml): `--prompts` questions of the built-in arith task
with the config's prompt_suffix, rendered with the model's chat template, `--samples` responses each
(GRPO group size n) of lengths uniform in [15, 48] tokens (what the demo generates: ~30 tokens at step 1,
~15 later, 48 at most), cut from an arithmetic answer text. Rollout logprobs are the model's own (ratio
~1, as on-policy), advantages +-1. trainer.micro_batch_size = 8 as in the demo.

Trainers with the same weights take the same batch alternately (A B C A B C ...) after one untimed
warm-up step each; all apply the same updates, so they stay equal. `--variants` picks them: "plain"
(`trainer.shared_prefix` off), "cache" (shared, the two padded decoder calls over a gathered KV cache:
the layout before issue 7), "row" (shared, one unpadded row with a prompt-tree mask), "auto" (shared,
`prefix_share.choose_layout`). Prints per run the wall and process-CPU seconds, then each variant's
median and its speed-up over plain, the tokens each layout runs through the decoder (real and with
padding, micro-batches as the trainer forms them), and the largest |logprob| difference to plain on
the batch before training. `--profile` instead runs torch.profiler over forward + backward of the
first micro-batch (after a warm-up) for each variant and prints the top ops by self CPU time. Other
work on the machine slows all sides alike only roughly: ratios from a loaded machine are indicative.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors import prefix_share  # noqa: E402
from actors.trainer.trainer import Trainer  # noqa: E402
from orchestrator.algo import TrainBatch  # noqa: E402
from orchestrator.config.load import load_config  # noqa: E402
from orchestrator.data.chat import render_prompt_ids  # noqa: E402
from orchestrator.data.datasets import load_examples  # noqa: E402
from orchestrator.utils.models import resolve_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def demo_batch(cfg, tokenizer, prompts: int, samples: int, seed: int) -> TrainBatch:
    """`prompts` arith questions x `samples` responses of 15-48 tokens (rollout logprobs filled later)."""
    rng = random.Random(seed)
    examples = rng.sample(load_examples(cfg.data), prompts)
    prompt_ids, response_ids = [], []
    for ex in examples:
        ids = render_prompt_ids(tokenizer, ex.prompt, cfg.data.system_prompt)
        text = (f"To solve {ex.prompt.split('?')[0]}, I work it out step by step. First I look at the two "
                f"numbers, then I apply the operation carefully and check the result once more. "
                f"The final answer is {ex.answer}.") * 3
        answer_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for _ in range(samples):
            prompt_ids.append(list(ids))
            response_ids.append(answer_ids[: rng.randint(15, 48)])
    # rollout logprobs: placeholders, replaced by the plain trainer's before any train_step
    return TrainBatch.with_sequence_advantages(prompt_ids, response_ids, [[0.0] * len(r) for r in response_ids],
                                               [rng.choice([-1.0, 1.0]) for _ in response_ids], ref_logprobs=None)


def micro_batches(batch: TrainBatch, mbs: int, shared: bool) -> list[list[int]]:
    """Sample indices of each micro-batch, ordered as `Trainer.train_step` orders them."""
    p, r = batch.prompt_ids, batch.response_ids
    idx = sorted(range(len(p)), key=lambda i: len(p[i]) + len(r[i]))
    if shared:
        idx = prefix_share.order_by_prompt(p, r, idx)
    return [idx[s : s + mbs] for s in range(0, len(idx), mbs)]


def decoder_tokens(batch: TrainBatch, mbs: int, layout: str) -> tuple[int, int]:
    """(real, computed) tokens the decoder runs for one train_step with `layout` ("plain", "cache", "row")."""
    p, r = batch.prompt_ids, batch.response_ids
    real = padded = 0
    for part in micro_batches(batch, mbs, layout != "plain"):
        if layout != "plain" and prefix_share.worth_sharing([p[i] for i in part]):
            uniq, _ = prefix_share.distinct_prompts([p[i] for i in part])
            real += sum(map(len, uniq)) + sum(len(r[i]) for i in part)
            padded += (sum(map(len, uniq)) + sum(len(r[i]) for i in part) if layout == "row"
                       else len(uniq) * max(map(len, uniq)) + len(part) * max(len(r[i]) for i in part))
        else:
            real += sum(len(p[i]) + len(r[i]) for i in part)
            padded += len(part) * max(len(p[i]) + len(r[i]) for i in part)
    return real, padded


def profile_micro_batch(trainers: dict, batch: TrainBatch, mbs: int, top: int) -> None:
    """torch.profiler (record_shapes) over forward + backward of sum(logprobs) of the first micro-batch,
    each variant after one warm-up call; prints the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    from actors.model.forward import collate

    for name, t in trainers.items():
        part = micro_batches(batch, mbs, name != "plain")[0]
        prompts, responses = [batch.prompt_ids[i] for i in part], [batch.response_ids[i] for i in part]
        mb = collate(prompts, responses, pad_id=t.pad_id)

        def step():
            t.model.zero_grad(set_to_none=True)
            prefix_share.micro_batch_logprobs(t, mb, prompts, responses).sum().backward()

        step()
        c0, w0 = time.process_time(), time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step()
        print(f"\n== {name}: one micro-batch of {len(part)} (prompt {len(prompts[0])}, responses "
              f"{min(map(len, responses))}-{max(map(len, responses))}), forward + backward, profiled: "
              f"{time.perf_counter() - w0:.2f} s wall, {time.process_time() - c0:.2f} s cpu")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=40))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/grpo_arith_cpu.yaml"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (one step per variant each)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the demo trainer uses all cores)")
    ap.add_argument("--variants", default="plain,cache,auto",
                    help="comma-separated of plain, cache, row, auto (first must be plain)")
    ap.add_argument("--profile", action="store_true", help="profile one micro-batch per variant instead")
    ap.add_argument("--top", type=int, default=15, help="profile rows")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    variants = args.variants.split(",")
    if variants[0] != "plain" or not set(variants) <= {"plain", "cache", "row", "auto"}:
        ap.error(f"--variants: plain first, then any of cache, row, auto; got {args.variants!r}")

    cfg = load_config(args.config)
    model_path = str(resolve_model_path("default", ""))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    batch = demo_batch(cfg, tokenizer, args.prompts, args.samples, args.seed)
    tc = OmegaConf.merge(cfg.trainer, {"num_threads": args.threads, "precision": "fp32"})
    trainers = {}
    for name in variants:
        t = Trainer(model_path, OmegaConf.merge(tc, {"shared_prefix": name != "plain"}), cfg.algo,
                    temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens,
                    pad_id=tokenizer.pad_token_id or 0)
        t.shared_prefix_layout = name if name != "plain" else "auto"
        trainers[name] = t
    mbs = tc.micro_batch_size
    uniq0 = prefix_share.distinct_prompts([batch.prompt_ids[i] for i in micro_batches(batch, mbs, True)[0]])[0]
    auto = prefix_share.choose_layout(trainers["plain"].model.config, [len(p) for p in uniq0],
                                      [len(batch.response_ids[i]) for i in micro_batches(batch, mbs, True)[0]])
    print(f"model {model_path} ({trainers['plain'].model.config._attn_implementation} attention)\n"
          f"{args.prompts} prompts x {args.samples} samples, prompt lengths "
          f"{sorted({len(p) for p in batch.prompt_ids})}, response lengths {min(map(len, batch.response_ids))}"
          f"-{max(map(len, batch.response_ids))}, micro_batch_size {mbs}, fp32, {args.threads} torch threads; "
          f"auto picks {auto!r} for the first micro-batch")
    for layout in ("plain", "cache", "row"):
        real, padded = decoder_tokens(batch, mbs, layout)
        print(f"decoder tokens per step, {layout:5s}: {real} real, {padded} computed (with padding)")
    if args.profile:
        profile_micro_batch(trainers, batch, mbs, args.top)
        return
    lps = {k: t.logprobs(batch.prompt_ids, batch.response_ids) for k, t in trainers.items()}
    batch.rollout_logprobs = lps["plain"]
    for k in variants[1:]:
        diff = max(abs(x - y) for ra, rb in zip(lps["plain"], lps[k]) for x, y in zip(ra, rb))
        print(f"max |logprob difference| {k} vs plain (same weights, fp32): {diff:.2e}; "
              f"shared prefix in use: {trainers[k].shared_prefix_on}")

    for t in trainers.values():  # warm-up (allocator, oneDNN kernels), untimed
        t.train_step(batch)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in trainers}
    for r in range(args.rounds):
        for name, t in trainers.items():
            w0, c0 = time.perf_counter(), time.process_time()
            t.train_step(batch)
            times[name].append((time.perf_counter() - w0, time.process_time() - c0))
            print(f"round {r + 1} {name:6s} wall {times[name][-1][0]:6.2f} s  cpu {times[name][-1][1]:6.2f} s",
                  flush=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    for k in variants:
        print(f"median train_step {k:6s}: {wall[k]:6.2f} s wall / {cpu[k]:6.2f} s cpu; speed-up plain/{k}: "
              f"{wall['plain'] / wall[k]:.2f}x wall, {cpu['plain'] / cpu[k]:.2f}x cpu")
    ref = trainers["plain"].model.parameters
    for k in variants[1:]:
        wdiff = max(float((pa - pb).abs().max()) for pa, pb in zip(ref(), trainers[k].model.parameters()))
        print(f"max |weight difference| plain vs {k} after {args.rounds + 1} equal steps: {wdiff:.2e}")
    print("note: the CPU may be shared with other work; ratios from a loaded machine are indicative")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
