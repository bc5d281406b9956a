"""What the non-finite update guard (actors/trainer/finite.py) costs per optimizer step on the default model.

    .venv/bin/python benchmarks/update_guard.py [--threads 2] [--repeats 5]

SmolLM2-135M-Instruct (fp32, 134.5M parameters in 272 tensors), fused AdamW with its state, random gradients of
norm ~1. Times, alternated and repeated (median): the guard of a normal step (`step_is_safe`: the 2-norms of the
weights and of the first moments; `all_finite` of the updated weights), the per-gradient isfinite loop it
replaced, the copy of weights + AdamW state that only a step that could overflow takes (`Snapshot`), and one
fused AdamW step for scale. Prints each and the guard / AdamW-step ratio; the whole train step of the default
run is ~10-20x an AdamW step on 2 cores (benchmarks/RESULTS.md, "Inside the big phases").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.trainer import finite  # noqa: E402
from benchmarks.optimizer_step import default_model_params  # noqa: E402


def seconds(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    params = default_model_params(args.threads, grad_scale=1 / 11600.0)  # global gradient norm ~1
    opt = torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.99), fused=True)
    opt.step()  # the AdamW state exists
    print(f"{sum(p.numel() for p in params) / 1e6:.1f}M parameters in {len(params)} tensors, {args.threads} threads")
    cases = {
        "guard, before the step (step_is_safe)": lambda: finite.step_is_safe(opt, 1.0),
        "guard, after the step (all_finite)": lambda: finite.all_finite(params),
        "replaced: isfinite loop over grads": lambda: all(torch.isfinite(p.grad).all() for p in params),
        "copy of weights + state (rare path)": lambda: finite.Snapshot(opt),
        "one fused AdamW step": opt.step,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(3):  # alternated
        for name, fn in cases.items():
            times[name].append(seconds(fn, args.repeats))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, t in med.items():
        print(f"{name:40s} {t * 1e3:8.1f} ms")
    guard = med["guard, before the step (step_is_safe)"] + med["guard, after the step (all_finite)"]
    print(f"guard per step {guard * 1e3:.1f} ms = {guard / med['one fused AdamW step']:.2f} x an AdamW step; "
          f"net of the loop it replaced {(guard - med['replaced: isfinite loop over grads']) * 1e3:+.1f} ms")


if __name__ == "__main__":
    main()
