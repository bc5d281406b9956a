"""The trainer's step with glibc's default malloc against `run.glibc_tunables: auto` (orchestrator/malloc_env.py).

    .venv/bin/python benchmarks/malloc_tunables.py [--steps 4] [--threads 1]

Each setting runs in its own fresh process (glibc reads GLIBC_TUNABLES when a process starts), one after the
other: the default config's Trainer (SmolLM2-135M-Instruct, fp32) takes `--steps` train steps on a batch shaped
like the demo's (4 prompts of 49 tokens x 8 responses of 17-48 tokens, random ids, seeded). Per step it prints
seconds, user and system CPU seconds and minor page faults (getrusage), then the ratio default / tuned of the
steady step (the mean of steps 3..N) and of the first step.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(steps: int, threads: int) -> None:
    """Run in the measured process: print one JSON line per step."""
    from actors.trainer.trainer import Trainer
    from orchestrator.algo import TrainBatch
    from orchestrator.config.load import load_config
    from orchestrator.models import resolve_model_path

    cfg = load_config(ROOT / "configs" / "grpo_arith_cpu.yaml", [f"trainer.num_threads={threads}"])
    trainer = Trainer(resolve_model_path(cfg.model.path), cfg.trainer, cfg.algo, 1.0, cfg.rollout.max_new_tokens)
    rng = random.Random(0)
    for step in range(steps):
        prompts, responses = [], []
        for _ in range(4):
            prompt = [rng.randrange(100, 40000) for _ in range(49)]
            for _ in range(8):
                prompts.append(prompt)
                responses.append([rng.randrange(100, 40000) for _ in range(rng.randrange(17, 49))])
        batch = TrainBatch(prompts, responses, [[-1.0] * len(r) for r in responses],
                           [[rng.uniform(-1, 1)] * len(r) for r in responses])
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        trainer.train_step(batch)
        r1, dt = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
        print(json.dumps({"step": step + 1, "s": dt, "user_s": r1.ru_utime - r0.ru_utime,
                          "sys_s": r1.ru_stime - r0.ru_stime, "minflt": r1.ru_minflt - r0.ru_minflt}), flush=True)


def measure(tunables: dict, steps: int, threads: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(tunables)
    out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps), "--threads", str(threads)],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.steps, args.threads)
        return 0
    if args.steps < 3:
        ap.error("--steps must be >= 3 (steps 3..N are the steady state)")
    from orchestrator.malloc_env import tunables_env

    tuned = tunables_env("auto", environ={})
    results = {}
    for name, env in (("glibc default", {}), ("run.glibc_tunables=auto", tuned)):
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {env or '(GLIBC_TUNABLES unset)'}", flush=True)
        rows = results[name] = measure(env, args.steps, args.threads)
        for r in rows:
            print(f"  step {r['step']}: {r['s']:.2f} s (user {r['user_s']:.2f}, sys {r['sys_s']:.2f}), "
                  f"{r['minflt']} minor faults", flush=True)
    (a, b) = results.values()
    steady = lambda rows: sum(r["s"] for r in rows[2:]) / len(rows[2:])  # noqa: E731
    print(f"steady step (steps 3..{args.steps}): default {steady(a):.2f} s, tuned {steady(b):.2f} s, "
          f"default / tuned = {steady(a) / steady(b):.2f}x")
    print(f"first step: default {a[0]['s']:.2f} s, tuned {b[0]['s']:.2f} s, default / tuned = {a[0]['s'] / b[0]['s']:.2f}x")
    print(f"all {args.steps} steps: default / tuned = {sum(r['s'] for r in a) / sum(r['s'] for r in b):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
