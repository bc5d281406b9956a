"""Phase times of real runs (metrics.jsonl) -> a Workload of fitted scaling laws. Pure Python.

The controller writes one JSON row per step with `timing/<phase>_s` (orchestrator/controller.py, PhaseTimer of
orchestrator/metrics/phases.py) and `rollout/tokens`. Per run, the first step (warm-up: compilation, caches,
allocator) is dropped; each phase is the median over the remaining steps, except the checkpoint, which is the mean
(a checkpoint every N steps costs its time / N per step). The GPUs each role held come from the run's
config file beside metrics.jsonl when there is one, otherwise from `--measured-gpus`.

The per-step generate times (each over its run's median) become the workload's generate_scale: the
step-to-step variation the simulator replays in every mode, which stream mode's k absorbs
(orchestrator.sizing.stream_sim); at most MAX_SCALE_STEPS of them.

Runs at different sizes are fitted together (orchestrator.sizing.scaling.fit_law). Generate, train
and reference times are first scaled to the first run's tokens per step (their work grows with the
tokens), so that runs with different response lengths are comparable.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from orchestrator.sizing.scaling import Law, fit_law
from orchestrator.sizing.workload import Workload

PHASE_KEYS: dict[str, str] = {
    "generate": "timing/generate_s", "train": "timing/train_s", "sync": "timing/weight_sync_s",
    "reward": "timing/reward_s", "reference": "timing/reference_s", "checkpoint": "timing/checkpoint_s",
    "sample": "timing/sample_s", "advantages": "timing/advantages_s",
    "critic": "timing/critic_update_s"}  # PPO's critic (algo.estimator=gae): its update, inside the train phase
ASYNC_GENERATE_KEY = "async/generate_s"
# stream runs (rollout.mode=stream) mark their rows with STREAM_ROW_KEY; their generation cost is the
# engines' busy seconds in the step (a batch of work per step on average), not timing/generate_s (the wait)
STREAM_ROW_KEY, STREAM_GENERATE_KEY = "async/buffer_groups", "rollout/worker_generate_s_mean"
REQUIRED = ("generate", "train")
ROLES = ("rollout", "trainer", "reference")
CONFIG_NAMES = ("config.yaml", "config.yml", "resolved_config.yaml", "config.json")
MAX_SCALE_STEPS = 64  # per-step generate multipliers kept (the simulator replays them in a cycle)


class MeasurementError(ValueError):
    """A metrics file or a GPU count that cannot be used; the message names the file or option."""


@dataclass
class RunMeasurement:
    """One run: GPUs per role, per-phase seconds per step, tokens per step, and where they came from."""

    path: str
    gpus: dict[str, int]
    phases: dict[str, float]
    tokens: Optional[float]
    steps_used: int
    steps_total: int
    gpus_source: str
    config: dict = field(default_factory=dict)  # rollout_unit / staleness read from the config, if any
    generate_steps: list[float] = field(default_factory=list)  # seconds of each used step's generation
    sync_hidden_frac: Optional[float] = None  # overlapped runs: the sync's part the trainer did not wait for


def read_rows(path: str | Path) -> list[dict]:
    """The JSON rows of a metrics.jsonl (a run folder is accepted: its metrics.jsonl).

    Raises MeasurementError naming the file: missing, unparsable line (with its number), no rows, or no
    row with the required timing keys (timing/generate_s and timing/train_s)."""
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.is_file():
        raise MeasurementError(f"--metrics {path}: no such file")
    rows = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise MeasurementError(f"--metrics {p}: line {i} is not JSON ({e.msg})") from None
    return timed_rows(rows, f"--metrics {p}")


def timed_rows(rows: list, where: str) -> list[dict]:
    """The rows (dicts) that have the required timing keys (timing/generate_s and timing/train_s).

    Raises MeasurementError starting with `where` when none has them."""
    timed = [r for r in rows if isinstance(r, dict) and all(PHASE_KEYS[k] in r for k in REQUIRED)]
    if not timed:
        raise MeasurementError(f"{where}: no step row has the timing keys "
                               f"{', '.join(PHASE_KEYS[k] for k in REQUIRED)} "
                               "(is it a metrics.jsonl of `rl-orch run`?)")
    return timed


def parse_gpus(text: str) -> dict[str, int]:
    """'rollout=2,trainer=4[,reference=1]' -> {'rollout': 2, 'trainer': 4, 'reference': 1}.

    Raises MeasurementError naming --measured-gpus for an unknown role, a non-integer, a count < 0,
    or a missing rollout/trainer."""
    out: dict[str, int] = {}
    for part in filter(None, (s.strip() for s in text.split(","))):
        role, _, value = part.partition("=")
        role = role.strip()
        if role not in ROLES:
            raise MeasurementError(f"--measured-gpus: unknown role {role!r}; allowed: {', '.join(ROLES)}")
        try:
            n = int(value)
        except ValueError:
            raise MeasurementError(f"--measured-gpus: {role}={value!r} is not an integer") from None
        if n < 0 or (role != "reference" and n < 1):
            raise MeasurementError(f"--measured-gpus: {role} must be >= {0 if role == 'reference' else 1} (got {n})")
        out[role] = n
    missing = [r for r in ("rollout", "trainer") if r not in out]
    if missing:
        raise MeasurementError(f"--measured-gpus: missing {', '.join(missing)} (e.g. rollout=1,trainer=1)")
    out.setdefault("reference", 0)
    return out


def config_gpus(run_dir: Path) -> Optional[tuple[dict[str, int], dict, str]]:
    """(GPUs per role, {'rollout_unit', 'staleness'} found, file name) from a config beside the metrics.

    rollout = rollout.num_workers * rollout.tensor_parallel_size (1 when absent); trainer =
    trainer.num_workers; reference = trainer.context_parallel_size (1 when absent) when algo.kl_coef > 0 (one
    ReferenceActor, or c context-parallel ranks: orchestrator/placement/start.py) else 0. None when no config file is there."""
    from omegaconf import OmegaConf

    for name in CONFIG_NAMES:
        f = run_dir / name
        if f.is_file():
            try:
                cfg = OmegaConf.load(f)
            except Exception as e:  # noqa: BLE001 - any parse error is reported with the file
                raise MeasurementError(f"{f}: cannot read the run's config ({e})") from None
            return (*role_gpus(cfg), name)
    return None


def role_gpus(cfg) -> tuple[dict[str, int], dict]:
    """(GPUs per role, {'rollout_unit', 'staleness'} found) of a run config (OmegaConf; keys may be
    missing), counted as `config_gpus` documents."""
    from omegaconf import OmegaConf

    def get(key, default):
        v = OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
        return default if v is None else v
    tp = int(get("rollout.tensor_parallel_size", 1))
    kl = float(get("algo.kl_coef", 0.0))
    gpus = {"rollout": int(get("rollout.num_workers", 1)) * tp, "trainer": int(get("trainer.num_workers", 1)),
            "reference": int(get("trainer.context_parallel_size", 1)) if kl > 0 else 0}  # c ranks (reference_cp.py)
    extra = {"rollout_unit": tp, "staleness": get("algo.max_staleness", None)}
    return gpus, {k: v for k, v in extra.items() if v is not None}


def measure_run(path: str | Path, measured_gpus: Optional[str] = None) -> RunMeasurement:
    """Read one run (see the module docstring). `measured_gpus` ('rollout=1,trainer=1') overrides the
    config; without either, MeasurementError asks for --measured-gpus."""
    rows = read_rows(path)
    p = Path(path)
    run_dir = p if p.is_dir() else p.parent
    found = config_gpus(run_dir)
    if measured_gpus is not None:
        gpus, extra, source = parse_gpus(measured_gpus), {}, "--measured-gpus"
    elif found is not None:
        gpus, extra, source = found[0], found[1], f"{run_dir / found[2]}"
    else:
        raise MeasurementError(f"--metrics {path}: no run config ({'/'.join(CONFIG_NAMES)}) beside it to read "
                               "the GPUs per role from; pass --measured-gpus rollout=R,trainer=T[,reference=F]")
    return measure_rows(rows, gpus, str(p), source, extra)


def measure_rows(rows: list[dict], gpus: dict[str, int], path: str, source: str, extra: dict) -> RunMeasurement:
    """A RunMeasurement of timed metrics rows (see `timed_rows`) at `gpus` per role (see the module
    docstring: the first row dropped as warm-up when there are more, medians, mean checkpoint)."""
    used = rows[1:] if len(rows) > 1 else rows  # the first step is warm-up
    phases, per_step = {}, {}
    for phase, key in PHASE_KEYS.items():
        # async runs (rollout.mode=one_step_off): timing/generate_s is only the wait for the
        # prefetched batch; async/generate_s is the whole generation, the cost the sizer needs
        values = [float(_generate_s(r) if phase == "generate" else _sync_s(r) if phase == "sync" else r[key])
                  for r in used if key in r]
        per_step[phase] = values
        if values:
            phases[phase] = statistics.fmean(values) if phase == "checkpoint" else statistics.median(values)
    tokens = [float(r["rollout/tokens"]) for r in used if "rollout/tokens" in r]
    return RunMeasurement(path, gpus, phases, statistics.median(tokens) if tokens else None, len(used),
                          len(rows), source, extra, per_step["generate"], sync_hidden_frac(rows))


def sync_hidden_frac(rows: list[dict]) -> Optional[float]:
    """The median fraction of an overlapped weight sync (weight_sync.overlap) the trainer did not wait for:
    1 - send / whole, pairing each sync's `sync/send_s` (the row of its `sync/version`) with its `sync/seconds`
    (start to verified: the engines held for the part after the send; the row whose `sync/verified_version` names
    it). None when no overlapped sync was settled in `rows` (synchronous syncs, or an older run)."""
    sends = {r["sync/version"]: float(r["sync/send_s"]) for r in rows if "sync/send_s" in r and "sync/version" in r}
    fracs = [1.0 - min(sends[v], whole) / whole for r in rows
             if (v := r.get("sync/verified_version")) in sends and r.get("sync/overlapped")
             and (whole := float(r.get("sync/seconds", 0.0))) > 0]
    return statistics.median(fracs) if fracs else None


def generate_variation(runs: list[RunMeasurement]) -> tuple[float, ...]:
    """Per-step generate multipliers (a Workload's generate_scale): each run's per-step generate seconds over
    that run's median, the runs one after another, at most MAX_SCALE_STEPS, each at least 0.001.
    () when no run has two steps or no step is more than 1% off its run's median (constant generation)."""
    out: list[float] = []
    for r in runs:
        med = statistics.median(r.generate_steps) if len(r.generate_steps) >= 2 else 0.0
        if med > 0:
            out += [max(v / med, 1e-3) for v in r.generate_steps]
    out = out[:MAX_SCALE_STEPS]
    return tuple(out) if out and max(abs(v - 1) for v in out) > 0.01 else ()


def _generate_s(row: dict) -> float:
    """A row's whole-generation seconds: async/generate_s (one-step-off rows), the engines' busy seconds
    (stream rows, STREAM_ROW_KEY), else timing/generate_s."""
    if STREAM_ROW_KEY in row and STREAM_GENERATE_KEY in row:
        return row[STREAM_GENERATE_KEY]
    return row.get(ASYNC_GENERATE_KEY, row[PHASE_KEYS["generate"]])


def _sync_s(row: dict) -> float:
    """A row's weight-sync seconds: the whole sync (`sync/seconds`: send, load, verification, probe) when it was
    overlapped with the next step (weight_sync.overlap), whose timing/weight_sync_s is the send alone."""
    if row.get("sync/overlapped") and "sync/seconds" in row:
        return row["sync/seconds"]
    return row[PHASE_KEYS["sync"]]


def _hidden_frac(runs: list[RunMeasurement], notes: list[str]) -> float:
    """The mean sync_hidden_frac of the runs that overlapped their syncs, with a note; 0 when none did."""
    measured = [r.sync_hidden_frac for r in runs if r.sync_hidden_frac is not None]
    if not measured:
        notes.append("weight sync: no overlapped sync measured; stream mode charges the whole sync to the trainer "
                     "(a bound on the safe side: weight_sync.overlap hides the engines' part)")
        return 0.0
    frac = statistics.fmean(measured)
    notes.append(f"weight sync: {frac:.0%} of it hidden behind training in stream mode (weight_sync.overlap, "
                 f"measured in {len(measured)} run(s)); the trainer waits for the send")
    return frac


def _token_scales(runs: list[RunMeasurement], notes: list[str]) -> list[float]:
    """Per run: first run's tokens per step / this run's (1 for all when a run lacks rollout/tokens)."""
    if len(runs) == 1:
        return [1.0]
    if any(not r.tokens for r in runs):
        notes.append("rollout/tokens missing in a run: phase times compared as measured (not per token)")
        return [1.0] * len(runs)
    notes.append(f"generate/train/reference times scaled to {runs[0].tokens:g} tokens per step")
    return [runs[0].tokens / r.tokens for r in runs]


def fit_workload(runs: list[RunMeasurement], *, switch_s: float = 0.0, rollout_unit: Optional[int] = None,
                 trainer_unit: int = 1, reference_unit: int = 1,
                 staleness: Optional[int] = None, variation: bool = True) -> tuple[Workload, list[str]]:
    """A Workload fitted to the runs, and notes saying how each law was obtained.

    generate ~ rollout GPUs, train ~ trainer GPUs, reference ~ reference GPUs (only runs that had one),
    weight sync ~ rollout GPUs (its receivers); reward (+ sample + advantages, controller CPU work) and
    checkpoint: means over the runs, independent of the split. rollout_unit / staleness default to the
    first run's config values, else 1. variation: replay the measured step-to-step generate times
    (`generate_variation`); False = the same generate time every step. Raises MeasurementError when `runs`
    is empty."""
    if not runs:
        raise MeasurementError("--metrics: at least one metrics file is needed")
    notes: list[str] = []
    scales = _token_scales(runs, notes)

    def points(role: str, phase: str, subset=None) -> list[tuple[float, float]]:
        chosen = [(r, s) for r, s in zip(runs, scales) if subset is None or subset(r)]
        work = phase in ("generate", "train", "reference")
        return [(r.gpus[role], r.phases.get(phase, 0.0) * (s if work else 1.0)) for r, s in chosen]

    laws: dict[str, Law] = {"generate": fit_law("rollout", points("rollout", "generate")),
                            "train": fit_law("trainer", points("trainer", "train")),
                            "sync": fit_law("sync", points("rollout", "sync"))}
    if any(r.gpus["reference"] > 0 for r in runs):
        laws["reference"] = fit_law("reference", points("reference", "reference", lambda r: r.gpus["reference"] > 0))
    for name, law in laws.items():
        notes.append(f"{name}: {law.describe()}; {law.note}")
    cpu = statistics.fmean(sum(r.phases.get(k, 0.0) for k in ("reward", "sample", "advantages")) for r in runs)
    ckpt = statistics.fmean(r.phases.get("checkpoint", 0.0) for r in runs)
    first = runs[0].config
    critic = statistics.fmean(r.phases.get("critic", 0.0) for r in runs)  # 0 without a critic
    workload = Workload(laws["generate"], laws["train"], laws["sync"], laws.get("reference"), reward_s=cpu,
                        checkpoint_s=ckpt, switch_s=switch_s,
                        rollout_unit=rollout_unit or int(first.get("rollout_unit", 1)),
                        trainer_unit=trainer_unit, reference_unit=reference_unit,
                        staleness=staleness or int(first.get("staleness", 1)), critic_s=critic,
                        generate_scale=generate_variation(runs) if variation else (),
                        sync_hidden_frac=_hidden_frac(runs, notes))
    if workload.generate_scale:
        sc = workload.generate_scale
        cv = statistics.pstdev(sc) / statistics.fmean(sc)
        notes.append(f"generate varies from step to step: cv {cv:.0%} over {len(sc)} step(s) (min {min(sc):.2f}x, "
                     f"max {max(sc):.2f}x the median), replayed in every mode (--constant-generate: off)")
    if critic > 0:
        notes.append(f"critic update: {critic:.4g} s per step (mean), on its own device beside the policy update")
    notes.append(f"reward + controller CPU work: {cpu:.4g} s per step; checkpoint: {ckpt:.4g} s per step (mean)")
    return workload, notes
