"""Sequence-packing benchmark: Trainer tokens/s with packed micro-batches against padded ones.

    .venv/bin/python benchmarks/packing.py                     # tiny random Llama, 4 rounds (A B C A B C ...)
    .venv/bin/python benchmarks/packing.py --model default --sequences 16 --budget 1024   # SmolLM2-135M

One global batch with a skewed length distribution (GRPO-like: prompts 24-40 tokens, responses
lognormal with a median of 24 tokens and a long tail up to `--max-new-tokens`) goes through
`Trainer.train_step` (forward + backward + one AdamW step, fp32) once per variant and round, alternated
(A B C D A B C D ...):

- A, padded-mem: `trainer.micro_batch_size = budget // (max prompt + max new tokens)`, i.e. the most
  sequences whose worst case fits the same token budget (the same activation memory) as a packed row;
  sequences sorted by length as the trainer does, each micro-batch right-padded to its longest.
- B, padded-avg: `trainer.micro_batch_size = ceil(sequences / packed rows)`: as many micro-batches as
  packing uses, so a padded micro-batch holds the budget's worth of real tokens on average (its peak,
  the micro-batch of the longest sequences, needs several times the budget).
- C, padded-arrival: `micro_batch_size` as in A, sequences in arrival order (no length sorting): what a
  trainer without packing or sorting does (TRL's GRPOTrainer, OpenRLHF/verl with packing and
  remove-padding off), micro-batches sized for the worst case.
- D, packed: `trainer.packing=true`, rows of at most `trainer.micro_batch_tokens = budget` tokens
  (first-fit decreasing, case C11).

All see the same real tokens and compute the same update (tests/unit/test_packing.py). Prints, per run,
tokens/s (real tokens / train_step seconds) by wall time and by this process's CPU time (with 1 thread
on a machine shared with other work, CPU time is the steadier measure), micro-batch counts and two
occupancies: of the budget, real tokens / (micro-batches * budget) (the trainer's `actor/token_occupancy`
with packing; target >= 95%), and of the computed tokens, real / (real + padding) (the trainer's metric
for padded micro-batches; 100% for packed rows); then the packed/padded ratios of the medians (target
>= 1.5x). Before the timed runs: the budget occupancy of first-fit decreasing over 200 batches drawn
from the same distribution against the lower bound ceil(real / budget) rows, and the padding of
micro-batches with and without length sorting. Torch runs 1 thread by default: on a shared 2-core
machine 2 threads made every run 3-6x slower and noisier. On CPU, attention over a packed row is a
dense sdpa with a block-diagonal mask (cost ~ row length squared); GPUs run flash attention varlen.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.model.forward import split_micro_batches  # noqa: E402
from actors.trainer.trainer import Trainer  # noqa: E402
from orchestrator.algo import TrainBatch  # noqa: E402
from orchestrator.algo.packing import pack_first_fit_decreasing, token_occupancy  # noqa: E402
from orchestrator.config.schema import AlgoConfig, TrainerConfig  # noqa: E402


def skewed_batch(n: int, max_new: int, vocab: int, seed: int) -> TrainBatch:
    """n sequences: prompts uniform in [24, 40] tokens, responses lognormal(ln 24, 1.1) clipped to
    [4, max_new] tokens; random token ids in [10, vocab)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, vocab) for _ in range(rng.randint(24, 40))] for _ in range(n)]
    lens = [min(max_new, max(4, round(rng.lognormvariate(math.log(24), 1.1)))) for _ in range(n)]
    responses = [[rng.randrange(10, vocab) for _ in range(k)] for k in lens]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-2.0] * len(r) for r in responses],
                                               [rng.choice([-1.0, 1.0]) for _ in range(n)], ref_logprobs=None)


def tiny_model(folder: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


class ArrivalOrderTrainer(Trainer):
    """The trainer with its length sorting off: micro-batches take the sequences in arrival order."""

    def _mini_batch_order(self, batch, rows: range) -> list[int]:
        return list(rows)


def make_trainer(model: str, max_new: int, threads: int, arrival: bool = False, **over) -> Trainer:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-6, "warmup_steps": 0, "precision": "fp32", "num_threads": threads, **over})
    cls = ArrivalOrderTrainer if arrival else Trainer
    return cls(model, tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=max_new)


def timed_step(trainer: Trainer, batch: TrainBatch) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds of this process, metrics) of one train_step."""
    t0, c0 = time.perf_counter(), time.process_time()
    m = trainer.train_step(batch)
    return time.perf_counter() - t0, time.process_time() - c0, m


def ffd_occupancy(n: int, max_new: int, budget: int, batches: int = 200) -> None:
    """Print the budget occupancy of first-fit decreasing over `batches` sampled batches, and what padding
    costs micro-batches of the same count with and without the trainer's length sorting (pure, fast)."""
    occ, at_bound, sorted_occ, unsorted_occ = [], 0, [], []
    for seed in range(1000, 1000 + batches):
        b = skewed_batch(n, max_new, 1000, seed)
        lengths = [len(p) + len(r) for p, r in zip(b.prompt_ids, b.response_ids)]
        rows = len(pack_first_fit_decreasing(lengths, budget))
        occ.append(token_occupancy(sum(lengths), rows, budget))
        at_bound += rows == math.ceil(sum(lengths) / budget)
        mbs = math.ceil(n / rows)
        sorted_occ.append(split_micro_batches(sorted(lengths), mbs)[1])
        unsorted_occ.append(split_micro_batches(lengths, mbs)[1])
    occ.sort()
    print(f"{n} sequences: FFD occupancy of the budget over {batches} batches: mean {statistics.mean(occ):.1%}, "
          f"p10 {occ[len(occ) // 10]:.1%}, min {occ[0]:.1%}; rows = ceil(real / budget) (the least possible) "
          f"in {at_bound}/{batches}")
    print(f"padded micro-batches of ceil({n} / rows) sequences, real / computed tokens: "
          f"{statistics.mean(sorted_occ):.1%} sorted by length (as the trainer does), "
          f"{statistics.mean(unsorted_occ):.1%} in arrival order")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (random Llama, 4 layers, hidden 256), 'default' "
                    "(SmolLM2-135M-Instruct) or an HF folder")
    ap.add_argument("--sequences", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=216)
    ap.add_argument("--budget", type=int, default=512, help="trainer.micro_batch_tokens")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads; 0 = all cores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--occupancy-sizes", type=int, nargs="*", default=[256],
                    help="other batch sizes (sequences) whose first-fit-decreasing occupancy is printed")
    ap.add_argument("--variants", default="padded-mem,padded-avg,padded-arrival,packed",
                    help="comma-separated subset of the runs (packed is always needed for the ratios)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench_packing_")
    if args.model == "default":
        from orchestrator.utils.models import resolve_model_path
        model = str(resolve_model_path("default"))
    elif args.model == "tiny":
        model = tiny_model(tmp)
    else:
        model = args.model
    max_len = 40 + args.max_new_tokens
    mbs = max(1, args.budget // max_len)
    from transformers import AutoConfig
    batch = skewed_batch(args.sequences, args.max_new_tokens, AutoConfig.from_pretrained(model).vocab_size, args.seed)
    resp = sorted(len(r) for r in batch.response_ids)
    real = sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids))
    print(f"model {model}; {args.sequences} sequences, {real} real tokens; response lengths min/median/p90/max "
          f"{resp[0]}/{resp[len(resp) // 2]}/{resp[int(0.9 * len(resp))]}/{resp[-1]}; budget {args.budget} tokens; "
          f"padded-mem micro_batch_size {mbs} (= {args.budget} // {max_len}); torch threads {args.threads or 'all'}")

    for n in sorted({args.sequences, *args.occupancy_sizes}):  # occupancy grows with the rows per batch
        ffd_occupancy(n, args.max_new_tokens, args.budget)
    lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
    mbs_avg = math.ceil(args.sequences / len(pack_first_fit_decreasing(lengths, args.budget)))
    print(f"padded-avg micro_batch_size {mbs_avg} (= ceil({args.sequences} / packed rows))")
    specs = {"padded-mem": dict(micro_batch_size=mbs), "padded-avg": dict(micro_batch_size=mbs_avg),
             "padded-arrival": dict(arrival=True, micro_batch_size=mbs),
             "packed": dict(packing=True, micro_batch_tokens=args.budget)}
    chosen = args.variants.split(",")
    if "packed" not in chosen or not set(chosen) <= set(specs):
        ap.error(f"--variants: a comma-separated subset of {list(specs)} that includes packed, got {args.variants!r}")
    runs = {k: make_trainer(model, args.max_new_tokens, args.threads, **v) for k, v in specs.items() if k in chosen}
    rates: dict[str, dict[str, list[float]]] = {"wall": {n: [] for n in runs}, "cpu": {n: [] for n in runs}}
    for r in range(args.rounds):
        for name, trainer in runs.items():  # A B C A B C
            wall, cpu, m = timed_step(trainer, batch)
            rates["wall"][name].append(real / wall)
            rates["cpu"][name].append(real / cpu)
            n_mb = int(m["actor/micro_batches"])
            computed = 1.0 if name == "packed" else m["actor/token_occupancy"]
            print(f"round {r + 1} {name:10s}: wall {wall:6.2f} s {real / wall:7.1f} tok/s, CPU {cpu:6.2f} s "
                  f"{real / cpu:7.1f} tok/s; micro-batches {n_mb:3d}, occupancy of the budget "
                  f"{real / (n_mb * args.budget):6.1%}, of computed tokens {computed:6.1%}; loss {m['actor/loss']:+.6f}",
                  flush=True)
    for clock, by_run in rates.items():
        med = {k: statistics.median(v) for k, v in by_run.items()}
        ratios = ", ".join(f"packed/{k} {med['packed'] / v:.2f}x" for k, v in med.items() if k != "packed")
        print(f"median tokens/s by {clock} time: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
              + f"; ratio {ratios} (target >= 1.5x)")


if __name__ == "__main__":
    main()
