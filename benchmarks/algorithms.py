"""Each advantage estimator and policy loss on the demo task: a learning check, not a test.

Runs the default config (configs/grpo_arith_cpu.yaml: SmolLM2-135M-Instruct, one-digit arithmetic, 4 prompts x 8
samples, 16 steps, seeded) once per variant, one after another, with held-out eval and trackers off, and prints
one table: reward mean over the first 5 and the last 5 steps, the gain, and seconds per step (mean of steps 2..N;
step 1 includes the engine's warm-up). Every variant starts from the same weights and the same seeds, so the
first step's reward is the same in every row; what differs after it is the update.

    .venv/bin/python benchmarks/algorithms.py --out /tmp/algos                 # every variant (~5 min each here)
    .venv/bin/python benchmarks/algorithms.py --only grpo,gspo --steps 8 --out /tmp/algos

Options:
    --only a,b        variants by name (default: all of VARIANTS)
    --steps N         trainer.total_steps (default 16)
    --mini-batches M  trainer.mini_batches for every variant (default 1: fully on-policy, where the ratio of every
                      clipped loss is 1 and the losses differ only in their gradient's form and aggregation;
                      M > 1 makes the later updates off-policy, where clipping acts)
    --out DIR         one run folder per variant (metrics.jsonl) and results.json
    --resume          keep the variants already in DIR/results.json (without an error) and run only the others;
                      so the variants can run one invocation at a time and a last call prints the whole table
    extra key=value   overrides applied to every variant

Variants whose estimator or loss is not registered in this checkout are reported as such, not run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo_arith_cpu.yaml"
BASE = ["eval.every_steps=0", "metrics.trackers=[]", "metrics.samples_every=0", "checkpoint.every_steps=0",
        "checkpoint.resume=none"]  # every variant from the base model, never from another run's checkpoint

# name -> overrides on top of the demo config (its estimator grpo, loss ppo_clip, token-mean)
VARIANTS: dict[str, list[str]] = {
    "grpo": [],
    "rloo": ["algo.estimator=rloo"],
    "dr_grpo": ["algo.estimator=dr_grpo", "algo.loss_agg=seq-mean-token-sum-norm"],
    "reinforce_plus_plus": ["algo.estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_baseline": ["algo.estimator=reinforce_plus_plus_baseline"],
    "gae (PPO, critic)": ["algo.estimator=gae"],
    "gspo": ["algo.policy_loss=gspo", "algo.loss_agg=seq-mean-token-mean"],
    "gspo_token": ["algo.policy_loss=gspo_token", "algo.loss_agg=seq-mean-token-mean"],
    "cispo": ["algo.policy_loss=cispo"],
    "entropy bonus 1e-3": ["algo.entropy_coef=0.001"],
    "dynamic sampling": ["algo.dynamic_sampling.enabled=true"],
}


def _registered() -> tuple[set, set]:
    sys.path.insert(0, str(ROOT))
    from orchestrator.algo import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
    return set(ADVANTAGE_ESTIMATORS.names()), set(POLICY_LOSSES.names())


def _missing(overrides: list[str], estimators: set, losses: set) -> str:
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "algo.estimator" and value not in estimators:
            return f"estimator {value!r} not registered"
        if key == "algo.policy_loss" and value not in losses:
            return f"loss {value!r} not registered"
    return ""


def summarise(rows: list[dict]) -> dict:
    """First-5 / last-5 reward means and seconds per step (steps 2..N) of one run's metrics rows."""
    rows = [r for r in rows if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in rows]
    steps = [r["timing/step_s"] for r in rows[1:]] or [rows[0]["timing/step_s"]]
    first, last = sum(rewards[:5]) / len(rewards[:5]), sum(rewards[-5:]) / len(rewards[-5:])
    return {"steps": len(rows), "reward_first5": first, "reward_last5": last, "gain": last - first,
            "step_s": sum(steps) / len(steps), "rewards": rewards}


def run_variant(name: str, overrides: list[str], out: Path, steps: int, mini_batches: int, extra: list[str]) -> dict:
    folder = out / name.split(" ")[0]
    cmd = [sys.executable, "-m", "orchestrator", str(CONFIG), *BASE, f"trainer.total_steps={steps}",
           f"trainer.mini_batches={mini_batches}", f"run.output_dir={folder}", *overrides, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1][:300], "wall_s": wall}
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {**summarise(rows), "wall_s": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--mini-batches", type=int, default=1)
    ap.add_argument("--out", default="/tmp/rl_orch_algorithms")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("extra", nargs="*", help="key=value overrides for every variant")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"--only: unknown variants {unknown}; known: {list(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    estimators, losses = _registered()
    saved = out / "results.json"
    results = json.loads(saved.read_text()) if args.resume and saved.exists() else {}
    for name in names:
        if "error" not in results.get(name, {"error": ""}):
            continue
        why = _missing(VARIANTS[name], estimators, losses)
        results[name] = {"error": why} if why else run_variant(name, VARIANTS[name], out, args.steps,
                                                                args.mini_batches, args.extra)
        saved.write_text(json.dumps(results, indent=1))
        print(_row(name, results[name]), flush=True)
    print("\n| variant | overrides | reward first 5 | last 5 | gain | s/step |\n|---|---|---|---|---|---|")
    for name in names:
        print(_row(name, results[name], " ".join(VARIANTS[name]) or "(demo config)"))
    return 0


def _row(name: str, r: dict, overrides: str = "") -> str:
    if "error" in r:
        return f"| {name} | {overrides} | not run: {r['error']} | | | |"
    return (f"| {name} | {overrides} | {r['reward_first5']:.3f} | {r['reward_last5']:.3f} | {r['gain']:+.3f} | "
            f"{r['step_s']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
