"""What per-request seeds cost on vLLM's CPU backend (issue 17, exact resume): bare vLLM, one mode per process.

    before: vLLM's defaults (chunked prefill on), one request of n samples per prompt, the engine's random state
    whole:  chunked prefill off (`cpu_seeded_scheduling`), the same unseeded requests
    after:  chunked prefill off, one request per sample with its own seed (what the rollout worker does now)

Each mode samples the same prompts (the controller's `sample_prompts`) for `--rounds` rounds after a
warm-up and prints generated tokens per second; `after` also checks that a second pass over the same
prompts samples the same ids. Run with rollout.ignore_eos=true for equal work per mode. With chunked prefill on, seeded requests crash vLLM 0.32 on CPU
whenever a prefill is split ("CPU Generator does not use offset"), hence `whole`.

    .venv/bin/python benchmarks/seeded_sampling.py --mode before|whole|after [--rounds 3] [key=value ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("before", "whole", "after"), required=True)
    ap.add_argument("--config", default=str(ROOT / "configs/grpo_arith_cpu.yaml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from orchestrator.runtime.ray_connect import QUIET_ENV

    os.environ.update(QUIET_ENV)
    from vllm import LLM

    from actors.rollout.vllm_engine import engine_kwargs
    from benchmarks.bare_vllm import generation_inputs
    from orchestrator.config.load import load_config
    from orchestrator.controller import GRPOController

    cfg = load_config(args.config, [f"run.output_dir={tempfile.mkdtemp(prefix='seeded_sampling_')}", *args.overrides])
    ctl = GRPOController(cfg)  # no actors: prompts rendered and sampled as a run does
    kwargs = engine_kwargs(str(ctl.model_path), cfg.rollout, cfg.rollout.seed)
    if args.mode == "before":
        kwargs.pop("enable_chunked_prefill"), kwargs.pop("max_num_batched_tokens")
    llm = LLM(**kwargs)
    rates, same = [], True
    for r in range(args.rounds + 1):  # round 0: warm-up
        requests = ctl.sample_prompts(r + 1)
        if args.mode != "after":
            requests = [dataclasses.replace(q, seed=None) for q in requests]
        prompts, params, _ = generation_inputs(cfg.rollout, requests, cfg.rollout.n)
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        ids = [list(c.token_ids) for o in outputs for c in o.outputs]
        if args.mode == "after":
            same &= ids == [list(c.token_ids) for o in llm.generate(prompts, params, use_tqdm=False) for c in o.outputs]
        tokens = sum(map(len, ids))
        print(f"{args.mode} round {r}{' (warm-up)' if r == 0 else ''}: {tokens} tokens {dt:.2f} s "
              f"{tokens / dt:.1f} tok/s", flush=True)
        if r:
            rates.append((tokens, dt))
    tps = sum(t for t, _ in rates) / sum(d for _, d in rates)
    print(f"{args.mode}: {tps:.1f} tok/s over {args.rounds} rounds ({cfg.rollout.prompts_per_step} prompts x "
          f"n={cfg.rollout.n} x <= {cfg.rollout.max_new_tokens} tokens)"
          + (f"; a second pass sampled the same ids: {same}" if args.mode == "after" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
