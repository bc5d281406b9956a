"""`rl-orch size`: the trainer/rollout/reference split and placement mode from a run's phase times (pure).

    rl-orch size --metrics runs/grpo/metrics.jsonl --gpus 64
    rl-orch size --metrics runs/a/metrics.jsonl --measured-gpus rollout=1,trainer=1 \\
                 --metrics runs/b/metrics.jsonl --measured-gpus rollout=4,trainer=2 --gpus 256 --tp 8
    rl-orch size --metrics runs/grpo --measured-gpus rollout=2,trainer=2 --target-step-s 30 --gpus 512

Reads the `timing/*` keys of each metrics.jsonl (orchestrator.sizing.measurements), fits a scaling law
per role (orchestrator.sizing.scaling), searches the splits with the pipeline simulator
(orchestrator.sizing.sizer) and prints the recommendation, the config keys of its mode, its predicted step
time and utilisation per role, the runner-ups and the comparison to an equal split. Modes: colocated,
disaggregated, async (one step off, whole generations) and stream (fully asynchronous with partial rollouts:
the k recommended, `--max-k`, `--recompute-s`; the measured per-step generate times are replayed unless
`--constant-generate`). Bad input: a message on stderr, exit code 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from orchestrator.sizing.measurements import MeasurementError, RunMeasurement, measure_run
from orchestrator.sizing.recommend import format_sizing, recommend, sizing_warnings
from orchestrator.sizing.simulator import MODES
from orchestrator.sizing.sync_law import sync_law_from_cost_model
from orchestrator.sizing.workload import SizingError, Workload
from orchestrator.weight_sync.cost_model import FABRICS
from orchestrator.weight_sync.registry import strategy_names


def add_size_parser(sub: argparse._SubParsersAction) -> None:
    """Register `size` on the top-level subparsers (orchestrator/cli/__init__.py)."""
    p = sub.add_parser("size", help="recommend the rollout/trainer/reference GPU split from measured phase times",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Fit per-role scaling laws to measured phase times and pick the split and "
                                   "placement mode with the shortest simulated step.")
    p.add_argument("--metrics", action="append", required=True,
                   help="a run's metrics.jsonl (or its folder); repeat for runs at other sizes to fit scaling")
    p.add_argument("--measured-gpus", action="append", default=None,
                   help="GPUs per role of each --metrics run, in the same order: rollout=R,trainer=T[,reference=F]"
                        " (default: read from a config.yaml beside the metrics)")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs to split; with --target-step-s the most GPUs to consider (default 16384)")
    p.add_argument("--target-step-s", type=float, default=None,
                   help="find the fewest GPUs whose best split meets this step time instead")
    p.add_argument("--mode", choices=("auto", *MODES), default="auto", help="placement mode(s) to consider")
    p.add_argument("--tp", type=int, default=None, help="GPUs per rollout engine (tensor-parallel size); "
                                                        "default: the config's, else 1")
    p.add_argument("--trainer-unit", type=int, default=1, help="trainer GPUs come in multiples of this")
    p.add_argument("--reference-unit", type=int, default=1, help="reference GPUs come in multiples of this")
    p.add_argument("--staleness", type=int, default=None, help="async bound (algo.max_staleness); default "
                                                               "the config's, else 1")
    p.add_argument("--max-k", type=int, default=4,
                   help="stream mode (fully asynchronous, partial rollouts): the largest k (algo.max_staleness) "
                        "tried; the smallest k within 2%% of the best is recommended")
    p.add_argument("--recompute-s", type=float, default=0.0,
                   help="stream mode: rollout seconds to re-prefill the requests a weight sync interrupts "
                        "(0 = not counted)")
    p.add_argument("--constant-generate", action="store_true",
                   help="simulate the median generate time every step instead of the measured per-step times")
    p.add_argument("--switch-s", type=float, default=0.0,
                   help="colocated wake/sleep seconds per step (not in the metrics; 0 = not counted)")
    p.add_argument("--top", type=int, default=3, help="runner-ups to print")
    c = p.add_argument_group("weight sync on the target cluster (default: the measured sync, fitted)")
    c.add_argument("--sync-params", type=float, default=None,
                   help="predict the sync with the cost model (`rl-orch plan sync`) for this many parameters")
    c.add_argument("--sync-strategy", choices=strategy_names(), default="nccl")
    c.add_argument("--intra", default="nvlink", help=f"fabric inside a node: {', '.join(FABRICS)}")
    c.add_argument("--inter", default="ib400", help=f"fabric across nodes: {', '.join(FABRICS)}")
    c.add_argument("--gpus-per-node", type=int, default=8)
    p.set_defaults(func=run_size)


def _measure(args: argparse.Namespace) -> list[RunMeasurement]:
    gpus = args.measured_gpus
    if gpus is not None and len(gpus) != len(args.metrics):
        raise MeasurementError(f"--measured-gpus: given {len(gpus)} time(s) for {len(args.metrics)} --metrics; "
                               "give one per --metrics, in the same order")
    return [measure_run(m, gpus[i] if gpus else None) for i, m in enumerate(args.metrics)]


def _check_args(args: argparse.Namespace) -> None:
    for name in ("tp", "trainer_unit", "reference_unit", "staleness", "gpus", "max_k"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SizingError(f"--{name.replace('_', '-')}: must be >= 1 (got {v})")
    if args.gpus is None and args.target_step_s is None:
        raise SizingError("--gpus: required (or --target-step-s to find the fewest GPUs)")
    for name in ("switch_s", "recompute_s"):
        if not getattr(args, name) >= 0:
            raise SizingError(f"--{name.replace('_', '-')}: must be >= 0 (got {getattr(args, name)})")
    if args.top < 0:
        raise SizingError(f"--top: must be >= 0 (got {args.top})")


def _with_cost_model_sync(args: argparse.Namespace, w: Workload, notes: list[str]) -> Workload:
    """The workload with its sync law from the cost model when --sync-params is given."""
    if args.sync_params is None:
        return w
    if not args.sync_params >= 1:
        raise SizingError(f"--sync-params: must be >= 1 (got {args.sync_params:g})")
    try:
        law = sync_law_from_cost_model(args.sync_params, 2.0, args.sync_strategy, w.rollout_unit,
                                       args.gpus_per_node, args.intra, args.inter, args.gpus or 16384)
    except ValueError as e:
        raise SizingError(f"--{str(e).split(':')[0].replace('_', '-')}: {str(e).split(': ', 1)[-1]}") from None
    notes.append(f"sync (replaces the measured one): {law.describe()}; {law.note}")
    return dataclasses.replace(w, sync=law)


def _run_lines(runs: list[RunMeasurement]) -> list[str]:
    lines = ["measured:"]
    for r in runs:
        ph = r.phases
        g = ", ".join(f"{k} {v}" for k, v in r.gpus.items() if v)
        lines.append(f"  {r.path}: {g} GPU(s) (from {r.gpus_source}); {r.steps_used} of {r.steps_total} steps "
                     f"({'first dropped as warm-up' if r.steps_total > 1 else 'only one step: warm-up included'})")
        cells = [f"{k} {ph[k]:.3g} s" for k in ("generate", "reward", "reference", "train", "sync", "checkpoint")
                 if k in ph and (k != "reference" or r.gpus["reference"])]
        tok = f", {r.tokens:g} tokens/step" if r.tokens else ""
        lines.append("    median per step: " + ", ".join(cells) + tok)
    return lines


def run_size(args: argparse.Namespace) -> int:
    """`rl-orch size`: 0, or 2 with a message naming the input on bad input."""
    modes = MODES if args.mode == "auto" else (args.mode,)
    try:
        _check_args(args)
        runs = _measure(args)
        s, w, notes = recommend(runs, args.gpus or 16384, modes, switch_s=args.switch_s, rollout_unit=args.tp,
                                trainer_unit=args.trainer_unit, reference_unit=args.reference_unit,
                                staleness=args.staleness, target_step_s=args.target_step_s,
                                adjust=lambda w, notes: _with_cost_model_sync(args, w, notes), max_k=args.max_k,
                                recompute_s=args.recompute_s, variation=not args.constant_generate)
    except (MeasurementError, SizingError, ValueError) as e:  # FitError and the cost model's errors too
        print(f"size: {e}", file=sys.stderr)
        return 2
    lines = _run_lines(runs) + ["scaling (seconds per step vs the role's GPUs):"] + [f"  {n}" for n in notes]
    if "colocated" in modes and args.switch_s == 0:
        lines.append("  colocated: wake/sleep switch cost not measured, counted as 0 s (set --switch-s)")
    if args.target_step_s is not None:
        lines.append(f"fewest GPUs for a step of at most {args.target_step_s:g} s: {s.total}")
    print("\n".join(lines + [format_sizing(s, w, modes, args.top)] + sizing_warnings(runs, s, w)))
    return 0
