"""Elastic rollout on the default model (issue 40): a run that starts with one engine and may grow to two
(`placement.elastic`, the sizer's model on its own steps) against the same run fixed at one and at two engines; and
the time a lost engine costs with and without a warm spare (`rollout.spare_workers`).

Every run: the default config (SmolLM2-135M-Instruct, arithmetic, fp32 on CPU), 4 prompts x 8 samples x 48 new
tokens a step, no eval and no checkpoint but the last, weight_sync.strategy=nccl (our gloo group: the collective
group is re-formed at each change), on a local Ray of this machine's cores; every engine's bundle asks
placement.rollout_per_worker=0.25 CPU so that the spare fits. Printed and written to <out>/elastic_report.json:

- grow: each run's engine count per step, its median step time over the last --tail steps, and the elastic run's
  median against the run fixed at one engine (the count it ends with on one 2-core host: two engines only compete for
  its cores; target: within 10%), in --repeats interleaved pairs, with the median ratio; the run fixed at two engines
  once (when an elastic run ended there, or with one repeat); the elastic runs' changes and predictions.
- spare: rollout worker 0 is SIGKILLed as step --kill-at's generate call reaches it; the time lost is that step's
  time minus the run's median clean step, without a spare (a new engine starts) and with one (the spare takes its
  place).

    .venv/bin/python benchmarks/elastic.py [--steps 12] [--tail 5] [--kill-at 4] [--repeats 1] [--only grow] [--out DIR]

Takes about 10 minutes on 2 cores. Do not run it beside the integration tests (Ray's memory monitor).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

import ray  # noqa: E402

from orchestrator.config import load_config  # noqa: E402
from orchestrator.controller import GRPOController  # noqa: E402
from orchestrator.runtime.faults import fault_hook  # noqa: E402


def overrides(out: Path, steps: int, *extra: str) -> list[str]:
    return [f"run.output_dir={out}", f"checkpoint.dir={out / 'ckpt'}", "run.progress=false",
            f"trainer.total_steps={steps}", "checkpoint.every_steps=0", "checkpoint.every_minutes=0",
            "eval.every_steps=0", "weight_sync.strategy=nccl", "placement.rollout_per_worker=0.25", *extra]


class Killer(GRPOController):
    """Kills rollout worker 0 as step `kill_at`'s generate call reaches it (0: never)."""

    def __init__(self, cfg, kill_at: int = 0):
        super().__init__(cfg)
        self.kill_at, self.at, self.killed_at = kill_at, 0, None

    def step(self, step: int):
        self.at = step
        return super().step(step)

    def fault(self, window: str, k: int, handle) -> None:
        if (self.at, window, k) == (self.kill_at, "generate", 0) and self.killed_at is None:
            self.killed_at = time.monotonic()
            os.kill(ray.get(handle.pid.remote()), signal.SIGKILL)


def run_once(out: Path, steps: int, kill_at: int = 0, wait_spares: bool = False, *extra: str) -> dict:
    """One run on a fresh local Ray; its rows and wall time."""
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    controller = Killer(load_config(str(ROOT / "configs/grpo_arith_cpu.yaml"), overrides(out, steps, *extra)), kill_at)
    t0 = time.monotonic()
    try:
        controller.job.start()
        if wait_spares and controller.job.spares is not None:
            ray.get(controller.job.spares.readies)  # warm before the run: the kill measures the swap
        controller.job.start = lambda resume_from=None: None
        with fault_hook(controller.fault):
            result = controller.run()
    finally:
        controller.shutdown()
        ray.shutdown()
    return {"wall_s": time.monotonic() - t0, "rows": result.rows}


def tail_median(rows: list[dict], tail: int) -> float:
    return statistics.median(r["timing/step_s"] for r in rows[-tail:])


ELASTIC = ("placement.elastic=true", "rollout.max_workers=2", "sizing.warmup_steps=2", "sizing.cooldown_steps=2")


def _summary(run: dict, tail: int) -> dict:
    rows = run["rows"]
    out = {"engines": [r["engines/active"] for r in rows], "median_step_s_tail": round(tail_median(rows, tail), 3),
           "wall_s": round(run["wall_s"], 1)}
    if any("elastic/added" in r for r in rows):
        out["changes"] = [(r["step"], "add" if r.get("elastic/added") else "retire")
                          for r in rows if r.get("elastic/added") or r.get("elastic/retired")]
        out["predicted_step_s"] = [round(r["elastic/predicted_step_s"], 3) for r in rows
                                   if "elastic/predicted_step_s" in r]
    return out


def grow(out: Path, steps: int, tail: int, repeats: int = 1) -> dict:
    """`repeats` pairs (the run fixed at one engine, then the elastic run), interleaved so that the machine's drift
    hits both alike; the run fixed at two engines once, when an elastic run ended at two (or with one repeat)."""
    report: dict = {"pairs": []}
    for i in range(repeats):
        fixed = _summary(run_once(out / f"fixed_1_{i}", steps), tail)
        el = _summary(run_once(out / f"elastic_{i}", steps, 0, False, *ELASTIC), tail)
        report["pairs"].append({"fixed_1": fixed, "elastic": el, "elastic_ended_with": el["engines"][-1],
                                "elastic_vs_fixed_1": round(el["median_step_s_tail"] / fixed["median_step_s_tail"], 3)})
    if repeats == 1 or any(p["elastic_ended_with"] == 2 for p in report["pairs"]):
        report["fixed_2"] = _summary(run_once(out / "fixed_2", steps, 0, False, "rollout.num_workers=2"), tail)
    ratios = [p["elastic_vs_fixed_1"] for p in report["pairs"]]
    report["elastic_vs_fixed_1_median"] = round(statistics.median(ratios), 3)
    return report


def spare(out: Path, steps: int, kill_at: int) -> dict:
    report = {}
    for name, extra in (("no_spare", ()), ("one_spare", ("rollout.spare_workers=1",))):
        run = run_once(out / name, steps, kill_at, True, *extra)
        rows = {r["step"]: r for r in run["rows"]}
        clean = statistics.median(r["timing/step_s"] for s, r in rows.items() if s not in (1, kill_at))
        report[name] = {"killed_step_s": round(rows[kill_at]["timing/step_s"], 2), "median_clean_step_s": round(clean, 2),
                        "time_lost_s": round(rows[kill_at]["timing/step_s"] - clean, 2),
                        "restarts": rows[kill_at]["rollout/worker_restarts"]}
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tail", type=int, default=5, help="steps at the end whose median step time is compared")
    ap.add_argument("--kill-at", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", choices=("grow", "spare"), default=None)
    ap.add_argument("--repeats", type=int, default=1, help="grow: pairs of (fixed at one engine, elastic) runs, "
                                                           "interleaved")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="elastic_bench_"))
    result = {}
    if args.only in (None, "grow"):
        result["grow"] = grow(out, args.steps, args.tail, args.repeats)
    if args.only in (None, "spare"):
        result["spare"] = spare(out, min(args.steps, args.kill_at + 3), args.kill_at)
    (out / "elastic_report.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
