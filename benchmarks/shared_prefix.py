"""Shared-prompt forward benchmark (`trainer.shared_prefix`, actors/prefix_share.py): a full
`Trainer.train_step` (forward + backward + AdamW step, fp32) with the prompt run once per group against
the plain prompt+response forward.

    .venv/bin/python benchmarks/shared_prefix.py                 # default model, 4 prompts x 8 samples
    .venv/bin/python benchmarks/shared_prefix.py --rounds 3 --threads 1

The batch is the demo's (configs/grpo_arith_cpu.yaml): `--prompts` questions of the built-in arith task
with the config's prompt_suffix, rendered with the model's chat template, `--samples` responses each
(GRPO group size n) of lengths uniform in [15, 48] tokens (what the demo generates: ~30 tokens at step 1,
~15 later, 48 at most), cut from an arithmetic answer text. Rollout logprobs are the model's own (ratio
~1, as on-policy), advantages +-1. trainer.micro_batch_size = 8 as in the demo.

Two Trainers with the same weights, `trainer.shared_prefix` off (A) and on (B), take the same batch
alternately A B A B ... after one untimed warm-up step each; both apply the same updates, so they stay
equal. Prints per run the wall and process-CPU seconds, then the medians' ratio, the tokens each path
runs through the decoder (real and with padding, micro-batches as the trainer forms them), and the
largest |logprob| difference between the two paths on the batch before training. Other work on the
machine slows both sides alike only roughly: ratios from a loaded machine are indicative.
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
from actors.trainer import Trainer  # noqa: E402
from orchestrator.config.load import load_config  # noqa: E402
from orchestrator.data.chat import render_prompt_ids  # noqa: E402
from orchestrator.data.datasets import load_examples  # noqa: E402
from orchestrator.models import resolve_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def demo_batch(cfg, tokenizer, prompts: int, samples: int, seed: int) -> dict:
    """`prompts` arith questions x `samples` responses of 15-48 tokens (rollout logprobs filled later)."""
    rng = random.Random(seed)
    examples = rng.sample(load_examples(cfg.data), prompts)
    prompt_ids, response_ids, groups = [], [], []
    for g, ex in enumerate(examples):
        ids = render_prompt_ids(tokenizer, ex.prompt, cfg.data.system_prompt)
        text = (f"To solve {ex.prompt.split('?')[0]}, I work it out step by step. First I look at the two "
                f"numbers, then I apply the operation carefully and check the result once more. "
                f"The final answer is {ex.answer}.") * 3
        answer_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for _ in range(samples):
            prompt_ids.append(list(ids))
            response_ids.append(answer_ids[: rng.randint(15, 48)])
            groups.append(g)
    return {"prompt_ids": prompt_ids, "response_ids": response_ids, "group_ids": groups,
            "advantages": [rng.choice([-1.0, 1.0]) for _ in response_ids], "ref_logprobs": None}


def decoder_tokens(batch: dict, mbs: int, shared: bool) -> tuple[int, int]:
    """(real, padded) tokens the decoder runs for one train_step, micro-batches formed as the trainer does."""
    p, r = batch["prompt_ids"], batch["response_ids"]
    idx = sorted(range(len(p)), key=lambda i: len(p[i]) + len(r[i]))
    if shared:
        idx = prefix_share.order_by_prompt(p, r, idx)
    real = padded = 0
    for s in range(0, len(idx), mbs):
        part = idx[s : s + mbs]
        if shared and prefix_share.worth_sharing([p[i] for i in part]):
            uniq, _ = prefix_share.distinct_prompts([p[i] for i in part])
            real += sum(map(len, uniq)) + sum(len(r[i]) for i in part)
            padded += len(uniq) * max(map(len, uniq)) + len(part) * max(len(r[i]) for i in part)
        else:
            real += sum(len(p[i]) + len(r[i]) for i in part)
            padded += len(part) * max(len(p[i]) + len(r[i]) for i in part)
    return real, padded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/grpo_arith_cpu.yaml"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="timed A B pairs")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the demo trainer uses all cores)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cfg = load_config(args.config)
    model_path = str(resolve_model_path("default", ""))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    batch = demo_batch(cfg, tokenizer, args.prompts, args.samples, args.seed)
    tc = OmegaConf.merge(cfg.trainer, {"num_threads": args.threads, "precision": "fp32"})
    trainers = {}
    for name, shared in (("A plain", False), ("B shared", True)):
        trainers[name] = Trainer(model_path, OmegaConf.merge(tc, {"shared_prefix": shared}), cfg.algo,
                                 temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens,
                                 pad_id=tokenizer.pad_token_id or 0)
    a, b = trainers.values()
    lp_a = a.logprobs(batch["prompt_ids"], batch["response_ids"])
    lp_b = b.logprobs(batch["prompt_ids"], batch["response_ids"])
    diff = max(abs(x - y) for ra, rb in zip(lp_a, lp_b) for x, y in zip(ra, rb))
    batch["rollout_logprobs"] = lp_a
    mbs = tc.micro_batch_size
    print(f"model {model_path}\n{args.prompts} prompts x {args.samples} samples, prompt lengths "
          f"{sorted({len(p) for p in batch['prompt_ids']})}, response lengths {min(map(len, batch['response_ids']))}"
          f"-{max(map(len, batch['response_ids']))}, micro_batch_size {mbs}, fp32, {args.threads} torch threads")
    for name, shared in (("plain ", False), ("shared", True)):
        real, padded = decoder_tokens(batch, mbs, shared)
        print(f"decoder tokens per step, {name}: {real} real, {padded} with padding")
    print(f"max |logprob difference| shared vs plain (same weights, fp32): {diff:.2e}")
    print(f"shared prefix in use: A {a._shared_prefix_on}, B {b._shared_prefix_on}")

    for t in (a, b):  # warm-up (allocator, oneDNN kernels), untimed
        t.train_step(batch)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in trainers}
    for r in range(args.rounds):
        for name, t in trainers.items():
            w0, c0 = time.perf_counter(), time.process_time()
            t.train_step(batch)
            times[name].append((time.perf_counter() - w0, time.process_time() - c0))
            print(f"round {r + 1} {name:9s} wall {times[name][-1][0]:6.2f} s  cpu {times[name][-1][1]:6.2f} s",
                  flush=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    print(f"median train_step: plain {wall['A plain']:.2f} s wall / {cpu['A plain']:.2f} s cpu, "
          f"shared {wall['B shared']:.2f} s wall / {cpu['B shared']:.2f} s cpu")
    print(f"speed-up plain/shared: {wall['A plain'] / wall['B shared']:.2f}x wall, "
          f"{cpu['A plain'] / cpu['B shared']:.2f}x cpu")
    wdiff = max(float((pa - pb).abs().max()) for pa, pb in zip(a.model.parameters(), b.model.parameters()))
    print(f"max |weight difference| after {args.rounds + 1} equal steps: {wdiff:.2e}")
    print("note: the CPU may be shared with other work; ratios from a loaded machine are indicative")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
