"""Rollout throughput through the orchestrator against bare vLLM (issue 7): what our rollout layer costs.

A: a `RolloutWorkerActor` in Ray (actors/rollout/worker.py), placed and called the way the controller
   does (`worker.generate.remote(requests)`, ray.get at the driver): its engine driver (actors/rollout/stream.py
   `generate`: the samples queued at once, the engine stepped on the driver's thread) builds the trajectories and
   ships them back: timed at the driver around the call.
B: bare vLLM in this process: `vllm.LLM(**engine_kwargs(...))` with the same engine arguments
   (actors/rollout/vllm_engine.py builds both), the same token prompts and `SamplingParams` (one seeded
   request per sample, benchmarks/bare_vllm.py `generation_inputs`) and the same engine seed; timed around
   `llm.generate`.
Both get the same PromptRequest list each round (the controller's `sample_prompts(round)`), one warm-up
call each, then A B A B ... Same seed and same call sequence: each round's samples (and token counts)
should match between A and B, which the script checks. Prints tokens/s of each and the ratio A / B
(target >= 0.95), plus the worker-side generate seconds (so the Ray call's own share is visible) and the
cost of B's outputs -> Trajectory conversion (bare_vllm.to_trajectories, not part of B's time).

    .venv/bin/python benchmarks/rollout_overhead.py [--rounds 3] [--json out.json] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start_worker(cfg, model_path: str):
    """The rollout actor as orchestrator/placement/start.py starts it: the rollout bundle's CPUs, the job's env vars."""
    import ray

    from actors.rollout.worker import RolloutWorkerActor
    from orchestrator.runtime.ray_connect import QUIET_ENV

    ray.init(address="local", num_cpus=cfg.run.num_cpus or None, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": QUIET_ENV})
    opts = {"num_cpus": cfg.placement.rollout_per_worker if cfg.placement.resource == "CPU" else 0,
            "runtime_env": {"env_vars": QUIET_ENV}}
    w = RolloutWorkerActor.options(**opts).remote(model_path, cfg.rollout, cfg.rollout.seed)
    ray.get(w.ready.remote())
    return w


def run_a(worker, requests) -> dict:
    import ray

    t0 = time.perf_counter()
    trajs, m = ray.get(worker.generate.remote(requests))
    dt = time.perf_counter() - t0
    return {"s": dt, "tokens": sum(len(t.response_ids) for t in trajs), "worker_s": m["rollout/generate_s"],
            "ids": [t.response_ids for t in trajs]}


def run_b(llm, cfg, requests) -> dict:
    from benchmarks.bare_vllm import generation_inputs, to_trajectories

    prompts, params, issued = generation_inputs(cfg.rollout, requests, cfg.rollout.n)  # the worker's requests
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    trajs = to_trajectories(issued, outputs, 0)  # outputs -> trajectories, timed apart
    post = time.perf_counter() - t1
    return {"s": dt, "tokens": sum(len(c.token_ids) for o in outputs for c in o.outputs), "post_s": post,
            "ids": [t.response_ids for t in trajs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/grpo_arith_cpu.yaml"))
    ap.add_argument("--rounds", type=int, default=3, help="A B pairs after the warm-up")
    ap.add_argument("--json", default="")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from orchestrator.runtime.ray_connect import QUIET_ENV

    os.environ.update(QUIET_ENV)  # what the actor gets: B logs no more than A
    from orchestrator.config.load import load_config
    from orchestrator.controller import GRPOController

    if os.environ.get("BENCH_TMP"):  # a folder of one's choice for the run's files (made if missing)
        os.makedirs(os.environ["BENCH_TMP"], exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="rollout_overhead_", dir=os.environ.get("BENCH_TMP"))
    cfg = load_config(args.config, [f"run.output_dir={tmp}", *args.overrides])
    ctl = GRPOController(cfg)  # no actors: prompts rendered and sampled exactly as a run does
    worker = start_worker(cfg, str(ctl.model_path))
    from vllm import LLM

    from actors.pinning import engine_placement_kwargs
    from actors.rollout.vllm_engine import engine_kwargs

    # as VLLMEngine builds them (a non-colocated engine: the job's default placement)
    llm = LLM(**engine_kwargs(str(ctl.model_path), cfg.rollout, cfg.rollout.seed),
              **engine_placement_kwargs(cfg.rollout, False))
    import torch

    print(f"bare vLLM in this process: torch threads {torch.get_num_threads()}; "
          f"{cfg.rollout.prompts_per_step} prompts x n={cfg.rollout.n} x <= {cfg.rollout.max_new_tokens} tokens, "
          f"dtype {cfg.rollout.dtype}")
    rows = []
    for r in range(args.rounds + 1):  # round 0: warm-up of both
        requests = ctl.sample_prompts(r + 1)
        a = run_a(worker, requests)
        b = run_b(llm, cfg, requests)
        same = a["ids"] == b["ids"]
        tag = "warm-up" if r == 0 else f"round {r}"
        print(f"{tag:>8}: A {a['tokens']:4d} tok {a['s']:7.2f} s {a['tokens'] / a['s']:7.1f} tok/s (worker "
              f"{a['worker_s']:.2f} s) | B {b['tokens']:4d} tok {b['s']:7.2f} s {b['tokens'] / b['s']:7.1f} tok/s "
              f"(+ postprocess {1000 * b['post_s']:.1f} ms) | same samples: {same}", flush=True)
        if r:
            rows.append({k: v for k, v in {**{f"a_{k}": v for k, v in a.items()},
                                             **{f"b_{k}": v for k, v in b.items()}}.items() if not k.endswith("ids")}
                        | {"same_samples": same})
    a_tps = sum(x["a_tokens"] for x in rows) / sum(x["a_s"] for x in rows)
    b_tps = sum(x["b_tokens"] for x in rows) / sum(x["b_s"] for x in rows)
    ratios = [(x["a_tokens"] / x["a_s"]) / (x["b_tokens"] / x["b_s"]) for x in rows]
    call_s = sum(x["a_s"] - x["a_worker_s"] for x in rows) / len(rows)
    post_ms = 1000 * sum(x["b_post_s"] for x in rows) / len(rows)
    print(f"orchestrator (A) {a_tps:.1f} tok/s, bare vLLM (B) {b_tps:.1f} tok/s, ratio A/B {a_tps / b_tps:.3f} "
          f"(per round: {' '.join(f'{q:.3f}' for q in ratios)}; target >= 0.95)")
    print(f"A's Ray call outside the worker's generate: {call_s:.3f} s per call; trajectory building: {post_ms:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "a_tokens_per_s": a_tps, "b_tokens_per_s": b_tps,
                                               "ratio": a_tps / b_tps, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
