"""Where our GRPO step's time goes (issue 7): phase times, orchestration overhead, and a py-spy profile
of the two big phases (generate in the rollout actor, train in the trainer actor).

Runs the default job (configs/grpo_arith_cpu.yaml, the default model) for a few steps into a temporary
folder and prints, per step and as a mean over steps 2..N (step 1 is warm-up):
- the phase times of metrics.jsonl (`timing/<phase>_s`, see orchestrator/controller.py `step`);
- the orchestration overhead: the step's wall time outside generate, train and weight sync, as a
  fraction of the step (target <= 5%), broken down into sample, reward, reference, advantages,
  checkpoint, log (metrics row written, Prometheus observe, console: measured here, it runs between two
  `step` calls) and the remainder inside `step` that no phase covers;
- the Ray-call overhead inside the big phases: the controller's phase time minus the actor's own time
  (rollout: `rollout/tokens / rollout/tokens_per_s`; weight sync: `sync/seconds`).
With `--py-spy`, `py-spy record` samples the rollout and trainer actor processes over steps 2..N (non-
blocking, 25 Hz) and the samples are split by phase from their stacks (rollout actor: `generate` vs the
weight load; trainer: `train_step` vs the weight export and checkpoint); for each the top leaf functions
and their share of the phase's samples.

    .venv/bin/python benchmarks/profile_step.py [--steps 4] [--py-spy] [--json out.json] [key=value ...]

Sampling perturbs the timings a little: take phase times from a run without `--py-spy`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BIG = ("generate", "train", "weight_sync")
SMALL = ("sample", "reward", "reference", "advantages", "checkpoint")
# stack markers (substring of a py-spy frame "Class.method (path:line)") -> phase, first match wins, per actor
ROLLOUT_PHASES = (("RolloutWorker.generate (", "generate"), ("RolloutWorker._update (", "weight_sync"),
                  ("RolloutWorker.checksums (", "weight_sync"))
TRAINER_PHASES = (("Trainer.train_step (", "train"), ("Trainer.weights_for_sync (", "weight_sync"),
                  ("Trainer.save_checkpoint (", "checkpoint"))
GENERIC_LEAF = "OpOverloadPacket.__call__ ("  # torch.ops.<lib>.<op>(...): says nothing about which op
IDLE_LEAF = "Worker.main_loop ("  # the actor's main thread waiting for its next call (inside Ray's C++ core)


def make_controller(cfg, spy: "Optional[Spy]"):
    """A GRPOController whose step entry/exit and end-of-logging times are recorded in `.marks`."""
    from orchestrator import controller as ctl
    from orchestrator.metrics import MetricSink, registry

    marks: dict[int, dict[str, float]] = {}

    class LoggedMark(MetricSink):  # the last of metrics.sinks: its time is after console, JSONL log, Prometheus
        def log_row(self, row):
            marks[row["step"]]["logged"] = time.perf_counter()

    class ProfiledController(ctl.GRPOController):
        def step(self, step):
            if spy is not None and step == 2:
                spy.start(self.actors)
            marks[step] = {"enter": time.perf_counter()}
            out = super().step(step)
            marks[step]["exit"] = time.perf_counter()
            return out

    registry.SINKS["profile_logged_mark"] = LoggedMark
    cfg.metrics.sinks = [*cfg.metrics.sinks, "profile_logged_mark"]
    c = ProfiledController(cfg)
    c.marks = marks
    return c


class Spy:
    """py-spy record on the rollout and trainer actor processes, started at step 2, stopped at the end."""

    def __init__(self, out_dir: Path, rate: int = 25):
        self.out_dir, self.rate, self.procs = out_dir, rate, {}

    def start(self, actors) -> None:
        import ray

        pids = {"rollout": actors.rollout[0], "trainer": actors.trainer}
        for role, a in pids.items():
            pid = ray.get(a.__ray_call__.remote(lambda self: os.getpid()))
            out = self.out_dir / f"pyspy_{role}.txt"
            cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", str(self.rate),
                   "--format", "raw", "--nonblocking", "--output", str(out)]
            self.procs[role] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out)

    def stop(self) -> dict[str, Path]:
        files = {}
        for role, (p, out) in self.procs.items():
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
            if out.exists():
                files[role] = out
            else:
                print(f"py-spy ({role}) wrote nothing: {p.stderr.read().decode()[-500:]}", file=sys.stderr)
        return files


def split_profile(path: Path, markers) -> dict[str, Counter]:
    """Leaf-frame sample counts per phase from a py-spy raw file ("f1 (file:l);f2 (file:l) count")."""
    per: dict[str, Counter] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        phase = "idle" if frames[-1].startswith(IDLE_LEAF) else next((p for m, p in markers if m in stack), "other")
        per.setdefault(phase, Counter())[_leaf_name(frames)] += int(count)
    return per


def _leaf_name(frames: list[str]) -> str:
    """"func (file)" of the innermost frame; for torch's op dispatcher, the frame that called the op."""
    def name(f: str) -> str:
        func, _, where = f.partition(" (")
        return f"{func} ({where.rsplit(':', 1)[0]})"

    if frames[-1].startswith(GENERIC_LEAF) and len(frames) > 1:
        return f"{name(frames[-2])} -> torch op"
    return name(frames[-1])


def profile_table(role: str, per: dict[str, Counter], top: int) -> list[str]:
    lines = []
    for phase, c in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(c.values())
        lines.append(f"  {role} actor, phase {phase}: {total} samples")
        for name, n in c.most_common(top):
            lines.append(f"    {100 * n / total:5.1f}%  {name}")
    return lines


def step_breakdown(row: dict, marks: dict) -> dict[str, float]:
    """Seconds per component of one step's wall time (step_s + log), overhead fraction included."""
    t = {p: row.get(f"timing/{p}_s", 0.0) for p in BIG + SMALL}
    t["log"] = marks["logged"] - marks["exit"]
    t["remainder"] = row["timing/step_s"] - sum(row.get(f"timing/{p}_s", 0.0) for p in BIG + SMALL)
    t["wall"] = row["timing/step_s"] + t["log"]
    t["overhead"] = t["wall"] - sum(t[p] for p in BIG)
    t["overhead_frac"] = t["overhead"] / t["wall"]
    worker_s = row["rollout/tokens"] / row["rollout/tokens_per_s"] if row.get("rollout/tokens_per_s") else 0.0
    t["generate_call_overhead"] = t["generate"] - worker_s  # Ray call, (de)serialisation of trajectories
    t["sync_inner"] = row.get("sync/seconds", 0.0)
    t["rollout_tokens_per_s"] = row.get("rollout/tokens_per_s", 0.0)
    return t


COLS = ("wall", *BIG, *SMALL, "log", "remainder", "overhead", "overhead_frac", "generate_call_overhead",
        "rollout_tokens_per_s")


def report(rows: list[dict], marks: dict) -> dict:
    per_step = {r["step"]: step_breakdown(r, marks[r["step"]]) for r in rows}
    print("step " + " ".join(f"{c[:10]:>10}" for c in COLS))
    for s, t in per_step.items():
        print(f"{s:>4} " + " ".join(f"{t[c]:10.4f}" for c in COLS))
    later = [t for s, t in per_step.items() if s >= 2] or list(per_step.values())
    mean = {c: sum(t[c] for t in later) / len(later) for c in later[0]}
    mean["overhead_frac"] = mean["overhead"] / mean["wall"]
    print("mean " + " ".join(f"{mean[c]:10.4f}" for c in COLS) + "   (steps 2..N)")
    print(f"orchestration overhead: {mean['overhead']:.3f} s of {mean['wall']:.2f} s = "
          f"{100 * mean['overhead_frac']:.2f}% (target <= 5%)")
    for c in (*SMALL, "log", "remainder"):
        print(f"  {c:<11} {mean[c]:8.4f} s  {100 * mean[c] / mean['wall']:6.3f}% of the step")
    return {"per_step": per_step, "mean_steps_2_to_n": mean}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/grpo_arith_cpu.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--py-spy", action="store_true", help="sample the rollout and trainer actors over steps 2..N")
    ap.add_argument("--top", type=int, default=8, help="leaf functions listed per phase")
    ap.add_argument("--json", default="", help="also write the numbers here")
    ap.add_argument("--analyze", nargs=2, metavar=("ROLLOUT_RAW", "TRAINER_RAW"),
                    help="only split two existing py-spy raw files by phase (no run)")
    ap.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = ap.parse_args(argv)
    if args.analyze:
        for path, (role, markers) in zip(args.analyze, (("rollout", ROLLOUT_PHASES), ("trainer", TRAINER_PHASES))):
            print("\n".join(profile_table(role, split_profile(Path(path), markers), args.top)))
        return 0
    from orchestrator.config.load import load_config

    tmp = Path(tempfile.mkdtemp(prefix="profile_step_", dir=os.environ.get("BENCH_TMP")))
    cfg = load_config(args.config, [f"trainer.total_steps={args.steps}", "run.progress=false",
                                    f"run.output_dir={tmp}/run", f"checkpoint.dir={tmp}/ckpt", *args.overrides])
    spy = Spy(tmp) if args.py_spy else None
    c = make_controller(cfg, spy)
    try:
        result = c.run()
    finally:
        files = spy.stop() if spy is not None else {}
        c.shutdown()
    print(f"outputs: {tmp}")
    out = report(result.rows, c.marks)
    for role, markers in (("rollout", ROLLOUT_PHASES), ("trainer", TRAINER_PHASES)):
        if role in files:
            per = split_profile(files[role], markers)
            out[f"pyspy_{role}"] = {p: dict(cn.most_common(args.top)) | {"_total": sum(cn.values())}
                                    for p, cn in per.items()}
            print("\n".join(profile_table(role, per, args.top)))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
