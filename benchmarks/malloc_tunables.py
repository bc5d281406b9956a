"""The trainer's step with glibc's default malloc against `run.glibc_tunables: auto` (orchestrator/runtime/malloc_env.py).

    .venv/bin/python benchmarks/malloc_tunables.py [--steps 4] [--threads 1] [--warm-up] [--also GLIBC_TUNABLES ...]

Each setting runs in its own fresh process (glibc reads GLIBC_TUNABLES when a process starts), one after the
other: the default config's Trainer (SmolLM2-135M-Instruct, fp32) takes `--steps` train steps on a batch shaped
like the demo's (4 prompts of 49 tokens x 8 responses of 17-48 tokens, random ids, seeded). Per step it prints
seconds, user and system CPU seconds and minor page faults (getrusage), then the ratio default / tuned of the
steady step (the mean of steps 3..N), of the first step and of all steps (with the warm-up when run). `--also`
measures another GLIBC_TUNABLES string the same way (e.g. `auto`'s items plus glibc.malloc.hugetlb=1). `--warm-up`
runs the trainer's warm-up (`trainer.warm_up`, actors/trainer/warmup.py; 8 sequences of 49 + 48 tokens, groups
of 8) before step 1, as a run does, and prints it as step 0.
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


def _usage() -> tuple:
    return resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()


def _row(step: int, before: tuple) -> str:
    (r0, t0), (r1, t1) = before, _usage()
    return json.dumps({"step": step, "s": t1 - t0, "user_s": r1.ru_utime - r0.ru_utime,
                       "sys_s": r1.ru_stime - r0.ru_stime, "minflt": r1.ru_minflt - r0.ru_minflt})


def child(steps: int, threads: int, warm: bool) -> None:
    """Run in the measured process: print one JSON line per step."""
    from actors.trainer.trainer import Trainer
    from orchestrator.algo import TrainBatch
    from orchestrator.config.load import load_config
    from orchestrator.utils.models import resolve_model_path

    cfg = load_config(ROOT / "configs" / "grpo_arith_cpu.yaml", [f"trainer.num_threads={threads}"])
    trainer = Trainer(resolve_model_path(cfg.model.path), cfg.trainer, cfg.algo, 1.0, cfg.rollout.max_new_tokens)
    if warm:
        before = _usage()
        trainer.warm_up(49, cfg.rollout.max_new_tokens, cfg.rollout.n)
        print(_row(0, before), flush=True)
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
        before = _usage()
        trainer.train_step(batch)
        print(_row(step + 1, before), flush=True)


def measure(tunables: dict, steps: int, threads: int, warm: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(tunables)
    out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps), "--threads", str(threads),
                          *(["--warm-up"] if warm else [])],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm-up", action="store_true", help="the trainer's warm-up before step 1 (printed as step 0)")
    ap.add_argument("--also", action="append", default=[], metavar="GLIBC_TUNABLES",
                    help="measure this GLIBC_TUNABLES string too (repeatable)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.steps, args.threads, args.warm_up)
        return 0
    if args.steps < 3:
        ap.error("--steps must be >= 3 (steps 3..N are the steady state)")
    from orchestrator.runtime.malloc_env import tunables_env

    settings = [("glibc default", {}), ("run.glibc_tunables=auto", tunables_env("auto", environ={}))]
    settings += [(f"GLIBC_TUNABLES={value}", {"GLIBC_TUNABLES": value}) for value in args.also]
    results = {}
    for name, env in settings:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {env or '(GLIBC_TUNABLES unset)'}", flush=True)
        rows = measure(env, args.steps, args.threads, args.warm_up)
        for r in rows:
            print(f"  {'step ' + str(r['step']) if r['step'] else 'warm-up'}: {r['s']:.2f} s (user {r['user_s']:.2f}, "
                  f"sys {r['sys_s']:.2f}), {r['minflt']} minor faults", flush=True)
        results[name] = rows
    base = results.pop("glibc default")
    steps = lambda rows: [r for r in rows if r["step"]]  # noqa: E731
    steady = lambda rows: sum(r["s"] for r in steps(rows)[2:]) / len(steps(rows)[2:])  # noqa: E731
    total = lambda rows: sum(r["s"] for r in rows)  # noqa: E731
    for name, rows in results.items():
        first = steps(base)[0]["s"] / steps(rows)[0]["s"]
        print(f"{name}: steady step (steps 3..{args.steps}) default {steady(base):.2f} s, this {steady(rows):.2f} s, "
              f"default / this = {steady(base) / steady(rows):.2f}x; first step {first:.2f}x; "
              f"all {args.steps} steps{' and the warm-up' if args.warm_up else ''}: {total(base) / total(rows):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
