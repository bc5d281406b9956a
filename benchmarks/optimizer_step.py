"""AdamW step time on the default model's parameters: torch's per-tensor loop, foreach, and fused kernels.

    .venv/bin/python benchmarks/optimizer_step.py [--threads 2] [--repeats 3]

The trainer's profile (benchmarks/RESULTS.md, "Inside the big phases") showed `_single_tensor_adam`, the
per-tensor loop torch picks for CPU tensors by default, at about 7% of the train phase. This times one
`optimizer.step()` over SmolLM2-135M-Instruct's parameters (fp32, random gradients) for each
implementation, alternated twice, after one warm-up step each, and prints the ratio fused / default.
The trainer uses the fused kernel (actors/trainer/trainer.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = {"default (per-tensor loop)": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def default_model_params(threads: int, grad_scale: float) -> list:
    """The default model's parameters (fp32) with seeded random gradients of scale `grad_scale`, on `threads`
    torch threads (also used by benchmarks/update_guard.py)."""
    torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM

    from orchestrator.utils.models import resolve_model_path
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model_path("default")), dtype=torch.float32)
    params = list(model.parameters())
    torch.manual_seed(0)
    for p in params:
        p.grad = torch.randn_like(p) * grad_scale
    return params


def time_step(params: list, kwargs: dict, repeats: int) -> float:
    """Mean seconds of one AdamW step (after one warm-up step that creates the state)."""
    opt = torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0, **kwargs)
    opt.step()
    t0 = time.perf_counter()
    for _ in range(repeats):
        opt.step()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    params = default_model_params(args.threads, grad_scale=1e-3)
    print(f"{sum(p.numel() for p in params) / 1e6:.1f}M parameters in {len(params)} tensors, {args.threads} threads")
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(2):  # alternated
        for kind, kwargs in KINDS.items():
            times[kind].append(time_step(params, kwargs, args.repeats))
            print(f"{kind:26s} {times[kind][-1]:.3f} s per step", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["default (per-tensor loop)"]
    print("median s per step: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items())
          + f"; fused / default = {med['fused'] / base:.2f}, foreach / default = {med['foreach'] / base:.2f}")


if __name__ == "__main__":
    main()
