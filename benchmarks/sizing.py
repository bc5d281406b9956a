"""The sizer's split against the equal split, the simulator against the clock, async against sync (issue 5).

On this machine with fake GPUs (placement.resource=fake_gpu, placement.fake_gpus=2: each fake GPU is one
pinned core, orchestrator/placement/plan.py) it runs the default job (configs/grpo_arith_cpu.yaml, the
default model, a step-by-step prompt, rollout.max_new_tokens; extra key=value overrides shape it, e.g. the
rollout-bound job of benchmarks/RESULTS.md: rollout.prompts_per_step=2 rollout.n=4 rollout.ignore_eos=true,
fixed-length responses so that every step does the same work) in:

1. calibration at two sizes: the equal split (disaggregated, rollout 1 + trainer 1 fake GPU, synchronous)
   and every role on both GPUs (colocated 2: 2 engines + 2 FSDP2 trainer ranks, time-sliced);
2. the sizer fitted to both runs (`orchestrator.sizing.recommend.recommend`: what `rl-orch size --metrics a
   --metrics b --gpus 2` runs) and its split, realised as config overrides by
   `orchestrator.placement.replace.to_overrides` (the mapping placement.auto uses), when not already measured;
3. rollout.mode=one_step_off 1 + 1 (one step off-policy), the async side of the sync/async ratio.

With --repeats R the rounds alternate; a placement already in the list is run once per round. Per
placement it prints the measured seconds per step (`timing/step_s` minus `timing/checkpoint_s`, mean of
steps 2..N over the repeats: step 1 is warm-up and the only checkpoint is the final one; async runs also
leave out step N, which no generation of a next batch overlaps), the simulator's prediction from the fit
(`orchestrator.sizing.workload.evaluate`), the relative error (judged on the placements the fit did not
see), and the ratios equal/sizer and sync/async, against the targets (sizer >= 1.2x the equal split;
predictions within 15%). --reuse keeps finished runs of the same overrides.

Modes searched: colocated, disaggregated and async are passed explicitly. The colocated wake/sleep switch
is counted as --switch-s seconds (default 0: on CPU vLLM has no sleep mode and the hooks only make Ray
calls, orchestrator/placement/modes.py); the colocated run's measured `colocate/sleep_s + wake_s` is printed
beside it. The final checkpoint is taken out of the rows the sizer reads (a one-off of the run's end, not
a per-step cost of a placement).

    .venv/bin/python benchmarks/sizing.py [--steps 5] [--repeats 1] [--max-new-tokens 128] [--smoke]
        [--reuse] [--out runs/sizing_bench] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "configs" / "grpo_arith_cpu.yaml"
GPUS = 2
SUFFIX = "Think step by step and show your work, then give the final answer as a number at the end."
BASE = ["placement.resource=fake_gpu", f"placement.fake_gpus={GPUS}", "checkpoint.every_steps=0",
        "run.progress=false"]
TARGET_SPEEDUP = 1.2
TARGET_ERROR = 0.15


# ---- pure parts (tests/unit/test_sizing_benchmark.py) ------------------------------------------------------
def step_seconds(rows: list[dict], drop_last: bool = False) -> list[float]:
    """Seconds of each timed step of a metrics log, in step order: `timing/step_s` minus `timing/checkpoint_s`
    (0 when absent). drop_last: leave out the last step (one_step_off: no generation of a next batch
    overlaps it, so it is shorter than a steady-state step). Raises ValueError when no step is left."""
    timed = sorted((r for r in rows if "timing/step_s" in r), key=lambda r: r.get("step", 0))
    if drop_last:
        timed = timed[:-1]
    if not timed:
        raise ValueError("metrics rows: no row with timing/step_s is left (is it a metrics.jsonl of `rl-orch run`,"
                         " with at least 2 steps for an async run?)")
    return [float(r["timing/step_s"]) - float(r.get("timing/checkpoint_s", 0.0)) for r in timed]


def without_checkpoint(rows: list[dict]) -> list[dict]:
    """The rows without `timing/checkpoint_s` (the final checkpoint is not a per-step cost)."""
    return [{k: v for k, v in r.items() if k != "timing/checkpoint_s"} for r in rows]


def after_warmup(values: list[float]) -> list[float]:
    """values[1:] (step 1 is warm-up), or values when there is only one."""
    return values[1:] if len(values) > 1 else list(values)


def summarise(measured: dict[str, list[list[float]]], predicted: dict[str, float], roles: dict[str, str],
              in_sample: frozenset = frozenset()) -> dict:
    """The result of the benchmark from per-placement step seconds and predictions.

    measured: placement -> one list of step seconds per run (all steps; step 1 dropped here); predicted:
    placement -> the simulator's seconds per step; roles: {"equal", "sizer", "async"} -> placement name;
    in_sample: placements whose runs the sizer was fitted to (their errors are shown, but the error target
    is judged on the other rows, the predictions the fit did not see, when there are any).
    Returns {"rows": [{placement, measured_s, measured_sd, steps, predicted_s, error, in_sample}],
    "equal_over_sizer", "sync_over_async", "worst_error", "targets": {...}}: measured_s = mean of every
    run's steps 2..N, error = predicted / measured - 1, ratios of measured seconds (> 1: the second is
    faster).
    Raises ValueError for a role naming a placement that was not measured."""
    rows = []
    means = {}
    for name, runs in measured.items():
        vals = [v for run in runs for v in after_warmup(run)]
        if not vals:
            raise ValueError(f"placement {name!r}: no measured steps")
        means[name] = statistics.fmean(vals)
        pred = predicted.get(name)
        rows.append({"placement": name, "measured_s": means[name],
                     "measured_sd": statistics.stdev(vals) if len(vals) > 1 else 0.0, "steps": len(vals),
                     "runs": len(runs), "predicted_s": pred, "in_sample": name in in_sample,
                     "error": None if pred is None else pred / means[name] - 1.0})
    for role, name in roles.items():
        if name not in means:
            raise ValueError(f"role {role!r}: placement {name!r} was not measured")
    eq_sizer = means[roles["equal"]] / means[roles["sizer"]] if "sizer" in roles else None
    sync_async = means[roles["equal"]] / means[roles["async"]] if "async" in roles else None
    judged = [r for r in rows if not r["in_sample"]] or rows
    errors = [abs(r["error"]) for r in judged if r["error"] is not None]
    worst = max(errors) if errors else None
    return {"rows": rows, "equal_over_sizer": eq_sizer, "sync_over_async": sync_async, "worst_error": worst,
            "targets": {"sizer_speedup": TARGET_SPEEDUP, "max_error": TARGET_ERROR,
                        "sizer_met": None if eq_sizer is None else eq_sizer >= TARGET_SPEEDUP,
                        "error_met": None if worst is None else worst <= TARGET_ERROR}}


def markdown(result: dict) -> str:
    """The summary as a markdown table and ratio lines."""
    lines = ["| placement | measured s/step (mean ± sd, n) | predicted s/step | error |", "|---|---|---|---|"]
    for r in result["rows"]:
        pred = "-" if r["predicted_s"] is None else f"{r['predicted_s']:.2f}"
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        fitted = " (fitted to it)" if r.get("in_sample") else ""
        lines.append(f"| {r['placement']}{fitted} | {r['measured_s']:.2f} ± {r['measured_sd']:.2f} ({r['steps']}) "
                     f"| {pred} | {err} |")
    t = result["targets"]

    def verdict(ok):
        return "n/a" if ok is None else ("met" if ok else "NOT met")
    if result["equal_over_sizer"] is not None:
        lines.append(f"\nequal / sizer: {result['equal_over_sizer']:.2f}x (target >= {t['sizer_speedup']}x: "
                     f"{verdict(t['sizer_met'])})")
    if result["sync_over_async"] is not None:
        lines.append(f"sync / async: {result['sync_over_async']:.2f}x")
    if result["worst_error"] is not None:
        scope = "placements the fit did not see" if any(r.get("in_sample") for r in result["rows"]) else "all"
        lines.append(f"worst |prediction error| ({scope}): {result['worst_error']:.1%} (target <= "
                     f"{t['max_error']:.0%}: {verdict(t['error_met'])})")
    return "\n".join(lines)


# ---- runs --------------------------------------------------------------------------------------------------
def job_overrides(args) -> list[str]:
    """The default job on the fake GPUs with the benchmark's overrides (every run shares these)."""
    return BASE + [f"trainer.total_steps={args.steps}", f"rollout.max_new_tokens={args.max_new_tokens}",
                   f"data.prompt_suffix={SUFFIX}", *args.overrides]


EQUAL = ["placement.mode=disaggregated", "rollout.num_workers=1", "trainer.num_workers=1",
         "placement.trainer_per_worker=1.0", "placement.rollout_per_worker=1.0"]
ASYNC = ["rollout.mode=one_step_off", *EQUAL[1:]]


def run_job(name: str, overrides: list[str], out: Path, timeout_s: float, reuse: bool = False) -> Path:
    """`python -m orchestrator <config> overrides run.output_dir=<out>/<name>` in a subprocess (its own local
    Ray); returns the run folder (its checkpoints deleted: ~1.6 GB each). Retried up to 4 times when the
    local Ray misses its fixed 30 s start-up window (a loaded machine). reuse: keep a finished run of the
    same overrides already in the folder (`_complete`). Raises RuntimeError with the log's tail when it fails."""
    folder = out / name
    if reuse and _complete(folder, overrides):
        print(f"[{time.strftime('%H:%M:%S')}] run {name}: reusing {folder} (--reuse)", flush=True)
        return folder
    cmd = [sys.executable, "-m", "orchestrator", str(CONFIG), *overrides, f"run.output_dir={folder}",
           f"checkpoint.dir={folder}/checkpoints", f"run.name=sizing_{name}"]
    log_path = out / f"{name}.log"
    print(f"[{time.strftime('%H:%M:%S')}] run {name}: {' '.join(overrides)}", flush=True)
    t0 = time.perf_counter()
    for attempt in range(1, 6):
        shutil.rmtree(folder, ignore_errors=True)  # a retry must not append to the failed try's metrics
        with open(log_path, "w") as log:
            p = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        text = log_path.read_text(errors="replace")
        if p.returncode == 0:
            break
        if attempt == 5 or "timed out during startup" not in text:
            raise RuntimeError(f"run {name} failed (exit {p.returncode}); log {log_path}:\n{text[-3000:]}")
        print(f"  the local Ray did not start within its 30 s (loaded machine); retry {attempt}/4", flush=True)
        time.sleep(20)
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    return folder


def _complete(folder: Path, overrides: list[str]) -> bool:
    """Whether `folder` holds a finished run of `overrides`: every one of them is in its config.yaml and its
    metrics log has trainer.total_steps rows."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(folder / "config.yaml")
        rows = read_rows(folder)
    except (OSError, ValueError):
        return False
    wanted = OmegaConf.from_dotlist(overrides)  # a key given twice: the last value wins, as in the run
    for item in overrides:
        key = item.split("=", 1)[0]
        if OmegaConf.select(cfg, key) != OmegaConf.select(wanted, key):
            return False
    return len(rows) == int(OmegaConf.select(cfg, "trainer.total_steps"))


def read_rows(folder: Path) -> list[dict]:
    from orchestrator.metrics.jsonl import read_jsonl

    return read_jsonl(folder / "metrics.jsonl")


def measure_dir(folder: Path):
    """The run's RunMeasurement as `rl-orch size --metrics <folder>/metrics.jsonl` reads it, with the final
    checkpoint taken out (a one-off of the run's end, not a per-step cost of a placement)."""
    from orchestrator.sizing.measurements import config_gpus, measure_rows, timed_rows

    gpus, extra, _ = config_gpus(folder)
    rows = timed_rows(without_checkpoint(read_rows(folder)), str(folder))
    return measure_rows(rows, gpus, str(folder / "metrics.jsonl"), "config.yaml", extra)


def size_runs(folders: list[Path], switch_s: float):
    """(sizing, workload, notes, measurements) of the runs, as `rl-orch size --metrics a --metrics b --gpus 2`
    computes them, with the modes colocated, disaggregated and async passed explicitly."""
    from orchestrator.sizing.recommend import recommend

    runs = [measure_dir(f) for f in folders]
    sizing, workload, notes = recommend(runs, GPUS, ("colocated", "disaggregated", "async"), switch_s=switch_s,
                                        staleness=1)
    return sizing, workload, notes, runs


def placement_of(split_overrides: dict) -> list[str]:
    return [f"{k}={v}" for k, v in split_overrides.items()]


EQUAL_NAME, FULL_NAME, ASYNC_NAME = "equal 1+1 (disaggregated)", "colocated 2 (both roles on both GPUs)", "async 1+1"
SLUGS = {EQUAL_NAME: "equal", FULL_NAME: "coloc2", ASYNC_NAME: "async"}


def plan(args, out: Path) -> dict:
    """Calibration: the equal split (every role on 1 GPU) and every role on both GPUs (colocated 2): the
    throughput of each role at two sizes, from which the sizer fits how each phase scales (the issue's "fitted
    from runs at two or more sizes"). Then the sizer's choice and async 1+1. Returns the placements to run
    ({name: overrides}), the predictions of the fit, the roles, the calibration runs and the sizer's printout."""
    from orchestrator.config import load_config
    from orchestrator.placement.replace import to_overrides
    from orchestrator.sizing.recommend import format_sizing
    from orchestrator.sizing.workload import Split, evaluate

    base = job_overrides(args)
    cfg = load_config(CONFIG, base + EQUAL)
    full_over, why = to_overrides(cfg, Split("colocated", GPUS, GPUS))
    if full_over is None:
        raise RuntimeError(f"colocated {GPUS} cannot be expressed in the config: {why}")
    known = {EQUAL_NAME: (Split("disaggregated", 1, 1), base + EQUAL),
             FULL_NAME: (Split("colocated", GPUS, GPUS), base + EQUAL + placement_of(full_over)),
             ASYNC_NAME: (Split("async", 1, 1), base + ASYNC)}
    calib = {n: run_job(f"{SLUGS[n]}_r1", known[n][1], out, args.timeout_s, args.reuse) for n in (EQUAL_NAME, FULL_NAME)}
    sizing, w, notes, runs = size_runs(list(calib.values()), args.switch_s)
    ph = runs[0].phases
    report = "\n".join([f"sizer fitted to the calibration runs ({', '.join(calib)}; modes colocated, disaggregated, "
                        f"async; switch {args.switch_s:g} s):", *[f"  {n}" for n in notes],
                        format_sizing(sizing, w, ("colocated", "disaggregated", "async"))])
    print(report, flush=True)
    bound = ph.get("generate", 0.0) > ph.get("train", 0.0) + ph.get("sync", 0.0)
    print(f"equal split: generate {ph.get('generate', 0):.2f} s, train {ph.get('train', 0):.2f} s, sync "
          f"{ph.get('sync', 0):.2f} s per step -> {'rollout-bound' if bound else 'NOT rollout-bound'}", flush=True)
    best = sizing.best.split
    over, why = to_overrides(cfg, best)
    if over is None:
        raise RuntimeError(f"the sizer's split {best.describe(w)} cannot be expressed in the config: {why}")
    sizer_name = next((n for n, (sp, _) in known.items() if sp == best), f"sizer: {best.describe(w)}")
    SLUGS.setdefault(sizer_name, "sizer")
    known.setdefault(sizer_name, (best, base + EQUAL + placement_of(over)))
    order = dict.fromkeys([EQUAL_NAME, FULL_NAME, sizer_name, ASYNC_NAME])  # run order, no duplicate
    placements = {n: known[n][1] for n in order}
    predicted = {n: evaluate(w, known[n][0]).step_s for n in order}
    roles = {"equal": EQUAL_NAME, "sizer": sizer_name, "async": ASYNC_NAME}
    return {"placements": placements, "predicted": predicted, "roles": roles, "calibration": calib,
            "sizer_report": report, "rollout_bound": bound, "phases": ph, "sizer_split": best.describe(w)}


def measure(args, out: Path, p: dict) -> tuple[dict, dict]:
    """Every placement `args.repeats` times, alternating; round 1's calibration runs are reused. Returns
    (placement -> step seconds per run, placement -> measured colocated switch seconds)."""
    measured: dict[str, list[list[float]]] = {n: [] for n in p["placements"]}
    switch: dict[str, float] = {}
    for r in range(1, args.repeats + 1):
        for name, overrides in p["placements"].items():
            if r == 1 and name in p["calibration"]:
                folder = p["calibration"][name]
            else:
                folder = run_job(f"{SLUGS[name]}_r{r}", overrides, out, args.timeout_s, args.reuse)
            rows = read_rows(folder)
            measured[name].append(step_seconds(rows, drop_last="rollout.mode=one_step_off" in overrides))
            sw = [float(x.get("colocate/sleep_s", 0)) + float(x.get("colocate/wake_s", 0)) for x in rows[1:]
                  if "colocate/sleep_s" in x]
            if sw:
                switch[name] = statistics.median(sw)
    return measured, switch


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="steps per run (step 1 is warm-up, left out)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of (equal, colocated 2, the sizer's choice if new, async) runs, alternating")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--switch-s", type=float, default=0.0, help="colocated wake/sleep seconds per step for the sizer")
    ap.add_argument("--smoke", action="store_true", help="tiny and quick: 3 steps, 16 new tokens, 1 repeat")
    ap.add_argument("--out", default=str(ROOT / "runs" / "sizing_bench"))
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="longest one run may take")
    ap.add_argument("--reuse", action="store_true", help="keep finished runs of the same overrides in --out")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides for every run")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.max_new_tokens, args.repeats = 3, 16, 1
    if args.steps < 3 or args.repeats < 1 or args.max_new_tokens < 1:
        ap.error("--steps must be >= 3 (step 1 is warm-up, an async run's last step is left out), "
                 "--repeats and --max-new-tokens >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    p = plan(args, out)
    measured, switch = measure(args, out, p)
    result = summarise(measured, p["predicted"], p["roles"], in_sample=frozenset(p["calibration"]))
    result.update({"command": " ".join(sys.argv), "steps": args.steps, "repeats": args.repeats,
                   "max_new_tokens": args.max_new_tokens, "switch_s_assumed": args.switch_s,
                   "switch_s_measured": switch, "rollout_bound": p["rollout_bound"],
                   "equal_split_phases_s": p["phases"], "sizer_split": p["sizer_split"],
                   "sizer_report": p["sizer_report"], "roles": p["roles"], "measured_step_s": measured})
    table = markdown(result)
    if switch:
        table += "\n" + "\n".join(f"measured colocated switch ({n}): {s:.3f} s per step" for n, s in switch.items())
    print("\n" + table)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    (out / "result.md").write_text(table + "\n")
    print(f"\nwrote {out / 'result.json'} and {out / 'result.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
