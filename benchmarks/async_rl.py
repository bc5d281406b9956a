"""Synchronous, one-step-off and fully asynchronous training (partial rollouts, k = 1, 2, 4) on the demo task,
with fake GPUs: rollout and trainer on their own core each (placement.resource=fake_gpu, placement.fake_gpus=2).

Runs the default config (SmolLM2-135M-Instruct, one-digit arithmetic, 4 prompts x 8 samples, seeded) once per
mode, one after another, held-out eval and trackers off, and prints one table: seconds per step (mean of steps
2..N), samples per second, the generation and train phases (the overlap limit is the slower of the two),
reward over the first and last 5 steps, wall time to reach a reward, and the staleness distribution of the
samples trained.

The synchronous baselines: `sync_colocated` (trainer and engine time-share one fake GPU, the other idle),
`sync_colocated_2gpu` (both fake GPUs, each an engine and a trainer rank, as colocated runs on a GPU node),
`sync_colocated_cpu` (no fake GPUs: each phase on both cores in turn, what the demo runs on this machine) and
`sync_disaggregated` (trainer and engine on a core each, in turn). "Best sync" is the fastest of those run.

    .venv/bin/python benchmarks/async_rl.py --out /tmp/async_rl                  # every mode, 16 steps (~40 min)
    .venv/bin/python benchmarks/async_rl.py --only sync_disaggregated,k2 --steps 8 --out /tmp/async_rl

Options: --only a,b (modes by name, default all of MODES); --steps N (default 16); --target R (the reward whose
wall time is compared, default 0.7); --out DIR (one run folder per mode and results.json); --seeds 0,1,2 (every
mode once per seed, into DIR/seed<S>, then a table over the seeds: one seed's time to a reward varies by more than
the modes differ, benchmarks/RESULTS.md); --resume (keep the modes already in DIR/results.json); --report
(summarise the runs already in DIR again, run nothing); extra key=value overrides for every mode.

Ratios printed: for each mode, wall time to the target reward of the best synchronous mode / its own (the
issue's target: >= 1.6x), and its step time / max(generation, training) of the synchronous disaggregated run
(the overlap limit: within 15% is the target).

Two clocks for "wall time to the reward": the batch clock (when the step that trained on the batch ended) and
the policy clock (when the policy whose samples the batch holds had been trained: the mean weight version of
the batch's tokens, `async/policy_version_mean`, interpolated on the steps' end times). A synchronous step s
trains on samples of version s - 1, so both clocks differ by one step there; a batch generated k versions
back measures a policy k steps older than the one training on it, so the batch clock alone charges the
asynchronous modes k steps of lag that their policy did not have.
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo_arith_cpu.yaml"
BASE = ["eval.every_steps=0", "metrics.trackers=[]", "metrics.samples_every=0", "checkpoint.every_steps=0",
        "checkpoint.resume=none", "placement.resource=fake_gpu", "placement.fake_gpus=2", "run.progress=false"]
SPLIT = ["rollout.num_workers=1", "trainer.num_workers=1", "placement.trainer_per_worker=1.0",
         "placement.rollout_per_worker=1.0"]
STREAM = ["rollout.mode=stream", *SPLIT]
MODES: dict[str, list[str]] = {
    "sync_colocated": ["placement.mode=colocated"],
    # colocated on both fake GPUs, as on a 2-GPU node: each core holds an engine and a trainer rank (gloo DP)
    "sync_colocated_2gpu": ["placement.mode=colocated", "rollout.num_workers=2", "trainer.num_workers=2"],
    # what a user of this 2-core machine runs (the demo): no fake GPUs, each phase on both cores in turn
    "sync_colocated_cpu": ["placement.mode=colocated", "placement.resource=CPU", "placement.fake_gpus=0"],
    "sync_disaggregated": ["placement.mode=disaggregated", *SPLIT],
    "one_step_off": ["rollout.mode=one_step_off", "algo.max_staleness=1", *SPLIT],
    "k1": [*STREAM, "algo.max_staleness=1"],
    "k2": [*STREAM, "algo.max_staleness=2"],
    "k4": [*STREAM, "algo.max_staleness=4"],
}
SYNC = ("sync_colocated", "sync_colocated_2gpu", "sync_colocated_cpu", "sync_disaggregated")
SAMPLES = 32  # samples per step: rollout.prompts_per_step 4 x rollout.n 8 of the demo config


def summarise(rows: list[dict], target: float) -> dict:
    """Per-run numbers from its metrics rows: step_s (mean of steps 2..N, without checkpoint writes: `_step_s`),
    samples_s, generate_s / train_s (phase means, steps 2..N), reward first/last 5, wall_to_target_s (cumulative
    step seconds until the reward, averaged over 3 steps, first reaches `target`; None if never), staleness
    histogram {s: samples}."""
    rows = [{**r, "timing/step_s": _step_s(r)} for r in rows if "reward/mean" in r]
    later = rows[1:] or rows
    mean = lambda key: sum(float(r.get(key, 0.0)) for r in later) / len(later)  # noqa: E731
    rewards = [r["reward/mean"] for r in rows]
    walls = list(itertools.accumulate(float(r["timing/step_s"]) for r in rows))
    wall, reached = 0.0, None
    for i, r in enumerate(rows):
        wall += float(r["timing/step_s"])
        window = rewards[max(0, i - 2):i + 1]
        if reached is None and len(window) == 3 and sum(window) / 3 >= target:
            reached = wall
    versions = [float(r.get("async/policy_version_mean", r["step"] - 1 - float(r.get("async/staleness", 0.0))))
                for r in rows]
    hist: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("async/staleness_") and k[16:].isdigit():
                hist[k[16:]] = hist.get(k[16:], 0.0) + v
            elif k == "async/staleness":  # the one-step-off pipeline: one staleness per batch
                hist[str(int(v))] = hist.get(str(int(v)), 0.0) + SAMPLES
    return {"steps": len(rows), "step_s": mean("timing/step_s"), "samples_s": SAMPLES / mean("timing/step_s"),
            "generate_s": mean("timing/generate_s"), "train_s": mean("timing/train_s"),
            "worker_generate_s": mean("roles/rollout_busy_s"),
            "reward_first5": sum(rewards[:5]) / len(rewards[:5]), "reward_last5": sum(rewards[-5:]) / len(rewards[-5:]),
            "wall_to_target_s": reached, "policy_to_target_s": policy_to_target(rewards, versions, walls, target),
            "staleness": hist, "rewards": rewards, "versions": versions,
            "wall": walls}


def _step_s(row: dict) -> float:
    """A step's seconds without its checkpoint write (`timing/checkpoint_s`: the run's last step writes the final
    checkpoint, 9-10 s in every mode here; neither generation nor training, so it is kept out of the step time,
    the overlap-limit ratio and the clocks)."""
    return float(row["timing/step_s"]) - float(row.get("timing/checkpoint_s", 0.0))


def policy_to_target(rewards: list[float], versions: list[float], walls: list[float], target: float) -> Optional[float]:
    """The policy clock (module docstring): the first 3-step window of mean reward >= `target`, timed at the mean
    weight version of its batches; version j exists once step j ended (walls[j - 1], seconds), version 0 at 0;
    a fractional version is interpolated linearly. None when no window reaches `target`."""
    ends = [0.0, *walls]
    for i in range(2, len(rewards)):
        if sum(rewards[i - 2:i + 1]) / 3 >= target:
            v = min(max(sum(versions[i - 2:i + 1]) / 3, 0.0), len(ends) - 1.0)
            lo = int(v)
            hi = min(lo + 1, len(ends) - 1)
            return ends[lo] + (ends[hi] - ends[lo]) * (v - lo)
    return None


def run_mode(name: str, out: Path, steps: int, target: float, extra: list[str]) -> dict:
    folder = out / name
    cmd = [sys.executable, "-m", "orchestrator", str(CONFIG), *BASE, f"trainer.total_steps={steps}",
           f"run.output_dir={folder}", *MODES[name], *extra]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(MODES[name])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1][:300]}
    return {**summarise(read_rows(folder), target), "process_s": time.perf_counter() - t0}


def _best_sync(ok: dict, key: str) -> Optional[float]:
    """The fastest synchronous mode's seconds to the target on clock `key` (None when none reached it)."""
    walls = [ok[n][key] for n in SYNC if n in ok and ok[n].get(key)]
    return min(walls) if walls else None


def _to_target(r: dict, key: str, best: Optional[float]) -> str:
    """'<seconds> (<best sync / seconds>x)' on clock `key`, or 'not reached'."""
    wall = r.get(key)
    if not wall:
        return "not reached"
    return f"{wall:.0f} ({best / wall:.2f}x)" if best else f"{wall:.0f}"


def table(results: dict, target: float) -> str:
    """The markdown table of `results` (name -> `summarise` output or {"error": ...})."""
    ok = {n: r for n, r in results.items() if "error" not in r}
    best = {key: _best_sync(ok, key) for key in ("wall_to_target_s", "policy_to_target_s")}
    limit = max(ok["sync_disaggregated"]["generate_s"], ok["sync_disaggregated"]["train_s"]) \
        if "sync_disaggregated" in ok else None
    lines = [f"| mode | s/step | samples/s | generate s | train s | reward first 5 | last 5 | batch clock to {target} s "
             f"(vs best sync) | policy clock to {target} s (vs best sync) | step / overlap limit | staleness (samples) |",
             "|---" * 11 + "|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | not run: {r['error']} |" + " |" * 9)
            continue
        lim = f"{r['step_s'] / limit:.2f}" if limit else "-"
        hist = ", ".join(f"{s}: {int(v)}" for s, v in sorted(r["staleness"].items(), key=lambda x: int(x[0]))) or "0: all"
        lines.append(f"| {name} | {r['step_s']:.1f} | {r['samples_s']:.2f} | {r['generate_s']:.1f} | {r['train_s']:.1f} | "
                     f"{r['reward_first5']:.3f} | {r['reward_last5']:.3f} | "
                     f"{_to_target(r, 'wall_to_target_s', best['wall_to_target_s'])} | "
                     f"{_to_target(r, 'policy_to_target_s', best['policy_to_target_s'])} | {lim} | {hist} |")
    return "\n".join(lines)


def read_rows(folder: Path) -> list[dict]:
    """The metrics rows of the run in `folder` (its metrics.jsonl)."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def seed_overrides(seed: int) -> list[str]:
    """The config keys one seed sets: the data order, the sampling seeds and the trainer's initial RNG."""
    return [f"run.seed={seed}", f"rollout.seed={seed}", f"data.seed={seed}"]


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2


def aggregate(per_seed: dict[int, dict], target: float) -> str:
    """The markdown table over seeds: per mode, each seed's time to `target` against that seed's best synchronous
    mode (batch and policy clocks), their median, and the ratio of the times summed over the seeds where both
    reached it (the mode's total time to the reward, every seed counted by its seconds); per-step speed likewise."""
    per_seed = {s: {n: r for n, r in res.items() if "error" not in r} for s, res in per_seed.items()}  # runs only
    lines = [f"| mode | seeds | per step vs best sync | batch clock to {target}: per seed | median | summed | "
             "policy clock: per seed | median | summed | step / overlap limit |", "|---" * 10 + "|"]
    for name in MODES:
        runs = {s: r for s, r in per_seed.items() if name in r}
        if not runs:
            continue
        cells = [name, ",".join(map(str, runs))]
        step = [min(per_seed[s][n]["step_s"] for n in SYNC if n in per_seed[s]) / r[name]["step_s"]
                for s, r in runs.items() if any(n in per_seed[s] for n in SYNC)]
        cells.append(f"{_median(step):.2f}x (median)" if step else "-")
        for key in ("wall_to_target_s", "policy_to_target_s"):
            pairs = [(_best_sync(per_seed[s], key), r[name].get(key)) for s, r in runs.items()]
            ratios = [f"{b / m:.2f}x" if b and m else "not reached" for b, m in pairs]
            both = [(b, m) for b, m in pairs if b and m]
            cells += [" / ".join(ratios), f"{_median([b / m for b, m in both]):.2f}x" if both else "-",
                      f"{sum(b for b, _ in both) / sum(m for _, m in both):.2f}x" if both else "-"]
        limits = [r[name]["step_s"] / max(per_seed[s]["sync_disaggregated"]["generate_s"],
                                         per_seed[s]["sync_disaggregated"]["train_s"])
                  for s, r in runs.items() if "sync_disaggregated" in per_seed[s]]
        cells.append(" / ".join(f"{x:.2f}" for x in limits) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_all(names: list[str], out: Path, args, extra: list[str]) -> dict:
    """Run (or with --report, summarise again) every mode of `names` into `out`; returns name -> results."""
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "results.json"
    results = json.loads(saved.read_text()) if (args.resume or args.report) and saved.exists() else {}
    for name in names:
        if args.report:
            if (out / name / "metrics.jsonl").exists():
                results[name] = summarise(read_rows(out / name), args.target)
            continue
        if name in results and "error" not in results[name]:
            continue
        results[name] = run_mode(name, out, args.steps, args.target, extra)
        saved.write_text(json.dumps(results, indent=1))
    return {n: results[n] for n in MODES if n in results and n in names}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--out", default="/tmp/rl_orch_async_rl")
    ap.add_argument("--seeds", default="", help="comma-separated seeds: every mode per seed, into OUT/seed<S>")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", action="store_true", help="summarise the runs already in --out again, run nothing")
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(MODES)
    if unknown := [n for n in names if n not in MODES]:
        ap.error(f"--only: unknown modes {unknown}; known: {list(MODES)}")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: comma-separated integers, e.g. 0,1,2")
    if not seeds:
        print(table(run_all(names, Path(args.out), args, args.extra), args.target))
        return 0
    per_seed = {}
    for seed in seeds:
        per_seed[seed] = run_all(names, Path(args.out) / f"seed{seed}", args, [*seed_overrides(seed), *args.extra])
        print(f"seed {seed}:\n{table(per_seed[seed], args.target)}\n", flush=True)
    print(aggregate(per_seed, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
