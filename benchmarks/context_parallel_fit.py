"""The longest packed row one rank trains in a fixed memory budget, with c = 1 (one process, SDPA) and c = 2 (two gloo
ranks, ring attention), measured and as the memory planner predicts it (issue 22). The model and the row are
benchmarks/context_parallel.py's: a random SmolLM2-135M-shaped Llama cut to `--layers` decoder layers, fp32, one
row of two sequences of L/2 tokens (64 prompt tokens each, the rest scored).

    python benchmarks/context_parallel_fit.py --budget-mib 1024 --layers 2

Memory of a rank = how far its resident set (Linux VmHWM, reset through /proc/self/clear_refs before the step)
rises above what it held before one forward + backward: activations, the logits buffers, the ring's K/V blocks,
the gradients, allocator slack. The model's weights were resident before and are not counted (they do not grow
with L; under FSDP they divide by the trainer's ranks whatever c is). Each (L, c) point runs in fresh processes.
Search: L doubles from --start until the budget is exceeded, then bisects to --step tokens.

Prediction: orchestrator.memory.estimate.trainer_bytes for the same shape (device cpu, fp32, one packed row of L
tokens, c = context_parallel, no FSDP): its gradients + activations (ring K/V included) + logits terms. Prints one
JSON line per measured point and one summary line per c.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SMOL = dict(hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152)  # benchmarks/context_parallel.py's
PROMPT = 64


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1))


def step_growth_mib(loss_fn) -> float:
    """MiB the resident set rises above its level before `loss_fn()` + backward (peak: VmHWM after a reset)."""
    gc.collect()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    loss_fn().backward()
    return round((_status_kib("VmHWM") - before) / 1024, 1)


def _single(seq_len: int, layers: int) -> float:
    import torch
    from actors.model.forward import forward_logprobs
    from benchmarks.context_parallel import build_model, packed_row

    torch.set_num_threads(1)
    model, mb = build_model(layers), packed_row(seq_len)
    return step_growth_mib(lambda: forward_logprobs(model, mb, 1.0).sum())


def _rank(rank: int, init: str, seq_len: int, layers: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from actors.model.context_parallel import RING_ATTENTION, cp_forward_logprobs
    from benchmarks.context_parallel import build_model, packed_row

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    model, mb = build_model(layers, RING_ATTENTION), packed_row(seq_len)
    growth = step_growth_mib(lambda: cp_forward_logprobs(model, mb, 1.0).sum())
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(growth, f)
    dist.destroy_process_group()


def _point(seq_len: int, c: int, layers: int) -> float:
    """This process: measure one (L, c) and print the rank's growth (c = 2: the larger of the two ranks')."""
    if c == 1:
        return _single(seq_len, layers)
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(f"file://{out}/rendezvous", seq_len, layers, out), nprocs=2, join=True)
        return max(json.load(open(f"{out}/{r}.json")) for r in range(2))


def measure(seq_len: int, c: int, layers: int) -> float:
    """One point in a fresh interpreter (nothing left over from the previous point's allocations)."""
    done = subprocess.run([sys.executable, __file__, "--point", str(seq_len), "--c", str(c), "--layers", str(layers)],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return float(done.stdout.strip().splitlines()[-1])


def predicted_mib(seq_len: int, c: int, layers: int) -> float:
    """The planner's gradients + activations + logits of one rank for this shape, MiB."""
    from orchestrator.memory.estimate import RunShape, trainer_bytes
    from orchestrator.memory.shapes import shape_from_numbers

    model = shape_from_numbers(layers=layers, tied=True, **SMOL)
    half = seq_len // 2
    run = RunShape(device="cpu", precision="fp32", trainer_ranks=1, context_parallel=c, packing_tokens=seq_len,
                   seq_len=half, response_len=half - PROMPT, engines=0)
    parts = trainer_bytes(model, run)
    return round((parts["grads"] + parts["activations"] + parts["logits"]) / 2**20, 1)


def largest(fits, start: int, step: int) -> int:
    """The largest multiple of `step` (>= start) for which fits(L) holds: doubling, then bisection. 0 if none."""
    lo, hi = 0, start
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-mib", type=float, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--start", type=int, default=1024)
    ap.add_argument("--step", type=int, default=256)
    ap.add_argument("--point", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--c", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        print(_point(args.point, args.c, args.layers), flush=True)
        return
    summary = {}
    for c in (1, 2):
        def fits(seq_len: int, c=c) -> bool:
            got = measure(seq_len, c, args.layers)
            print(json.dumps({"c": c, "seq_len": seq_len, "measured_MiB": got,
                              "predicted_MiB": predicted_mib(seq_len, c, args.layers)}), flush=True)
            return got <= args.budget_mib

        found = largest(fits, args.start, args.step)
        pred = largest(lambda n, c=c: predicted_mib(n, c, args.layers) <= args.budget_mib, args.start, args.step)
        summary[c] = found
        print(json.dumps({"c": c, "budget_MiB": args.budget_mib, "largest_seq_len": found,
                          "planner_largest_seq_len": pred}), flush=True)
    print(json.dumps({"ratio_c2_over_c1": round(summary[2] / max(1, summary[1]), 2)}), flush=True)


if __name__ == "__main__":
    main()
