"""`rl-orch plan <what>`: predictions before a run (pure: no Ray, no vLLM).

    rl-orch plan sync --model llama3-70b --engines 8 --gpus-per-engine 8 --engine-nodes 8 --inter ib400
    rl-orch plan sync --params 7e9 --engines 4 --inter eth25 --changed-fraction 0.03

`plan sync` prints the weight-sync cost model's prediction for every strategy (orchestrator.weight_sync.
cost_model) and marks the one `weight_sync.strategy: auto` would choose. Bad input: a message naming
the option on stderr, exit code 2. `plan memory` (the VRAM planner) lives in orchestrator/cli/plan_memory.py.
"""
from __future__ import annotations

import argparse
import sys

from orchestrator.memory.params import PRESETS, ModelConfigError, count_params, resolve_model_config
from orchestrator.weight_sync.cost_model import FABRICS, SyncEstimate, SyncSetup, SyncSetupError, setup_from_fabric
from orchestrator.weight_sync.registry import choose_strategy, predict_sync

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# SyncSetup field -> the `plan sync` option that sets it (error messages name the option).
_OPTION_OF = {"num_params": "--params", "bytes_per_param": "--dtype", "num_engines": "--engines",
              "gpus_per_engine": "--gpus-per-engine", "engine_nodes": "--engine-nodes",
              "fs_write_gbps": "--fs-write-gbps", "fs_read_gbps": "--fs-read-gbps",
              "changed_fraction": "--changed-fraction", "bucket_mb": "--bucket-mb", "load_gbps": "--load-gbps",
              "memcpy_gbps": "--memcpy-gbps", "encode_gbps": "--encode-gbps", "decode_gbps": "--decode-gbps",
              "op_latency_s": "--op-latency-s", "max_changed_fraction": "--max-changed-fraction",
              "intra": "--intra", "inter": "--inter"}


def _add_sync_parser(plan_sub: argparse._SubParsersAction) -> None:
    p = plan_sub.add_parser("sync", help="predicted weight-sync time per strategy",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            description="Predicted weight-sync time per strategy; * marks the auto choice. "
                                        "Rates in GB/s (gigaBYTES per second, 1e9 B/s). A run's "
                                        "`weight_sync.strategy: auto` uses the same model with its own config: "
                                        "--intra/--inter/--engine-nodes/--fs-*-gbps are "
                                        "weight_sync.fabric.{intra_node,inter_node,engine_nodes,fs_write_gbps,"
                                        "fs_read_gbps} (whose defaults describe one CPU host, not a GPU cluster).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help=f"preset ({', '.join(PRESETS)}), a config.json or a model folder")
    what.add_argument("--params", help="parameter count, e.g. 70e9")
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default="bf16")
    p.add_argument("--engines", type=int, default=1, help="rollout engines")
    p.add_argument("--gpus-per-engine", type=int, default=1, help="tensor-parallel size of each engine")
    p.add_argument("--engine-nodes", type=int, default=0,
                   help="nodes holding engines apart from the trainer's node (0 = same node)")
    p.add_argument("--intra", default="nvlink", help=f"fabric inside a node: {', '.join(FABRICS)}")
    p.add_argument("--inter", default="ib400", help=f"fabric across nodes: {', '.join(FABRICS)}")
    p.add_argument("--fs-write-gbps", type=float, default=SyncSetup.fs_write_gbps)
    p.add_argument("--fs-read-gbps", type=float, default=SyncSetup.fs_read_gbps,
                   help="aggregate over all readers")
    p.add_argument("--changed-fraction", type=float, default=SyncSetup.changed_fraction,
                   help="fraction of elements changed per step, for delta (measure it; reported RL runs "
                        "change a few percent of bf16 elements)")
    p.add_argument("--max-changed-fraction", type=float, default=SyncSetup.max_changed_fraction,
                   help="delta falls back to a full sync above it")
    p.add_argument("--bucket-mb", type=float, default=SyncSetup.bucket_mb)
    p.add_argument("--load-gbps", type=float, default=SyncSetup.load_gbps,
                   help="rate at which one engine loads a full weight set")
    p.add_argument("--memcpy-gbps", type=float, default=SyncSetup.memcpy_gbps)
    p.add_argument("--encode-gbps", type=float, default=SyncSetup.encode_gbps)
    p.add_argument("--decode-gbps", type=float, default=SyncSetup.decode_gbps)
    p.add_argument("--op-latency-s", type=float, default=SyncSetup.op_latency_s)
    p.set_defaults(func=plan_sync)


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    """Register `plan <what>` on the top-level subparsers: `plan sync` and `plan memory`
    (orchestrator/cli/plan_memory.py)."""
    from orchestrator.cli.plan_memory import add_memory_parser

    plan = sub.add_parser("plan", help="predictions before a run: plan sync | plan memory")
    plan_sub = plan.add_subparsers(dest="what", required=True)
    _add_sync_parser(plan_sub)
    add_memory_parser(plan_sub)


def _num_params(args: argparse.Namespace) -> tuple[int, str]:
    """(parameter count, label) from --model or --params; ValueError naming the option."""
    if args.model is not None:
        try:
            count = count_params(resolve_model_config(args.model), source=args.model)
        except ModelConfigError as e:
            raise ValueError(f"--model: {e}") from None
        return count.total, args.model
    try:
        value = float(args.params)
    except ValueError:
        raise ValueError(f"--params: expected a number such as 70e9 (got {args.params!r})") from None
    if not value >= 1 or value != value or value == float("inf"):
        raise ValueError(f"--params: must be a finite number >= 1 (got {args.params!r})")
    return int(round(value)), f"{value:.3g} params"


def setup_from_args(args: argparse.Namespace) -> tuple[SyncSetup, str]:
    """The SyncSetup the options describe and a label for the model; ValueError naming the option."""
    num_params, label = _num_params(args)
    try:
        setup = setup_from_fabric(
            num_params, DTYPE_BYTES[args.dtype], args.engines, args.gpus_per_engine, args.engine_nodes,
            intra=args.intra, inter=args.inter, fs_write_gbps=args.fs_write_gbps,
            fs_read_gbps=args.fs_read_gbps, changed_fraction=args.changed_fraction,
            max_changed_fraction=args.max_changed_fraction, bucket_mb=args.bucket_mb,
            load_gbps=args.load_gbps, memcpy_gbps=args.memcpy_gbps, encode_gbps=args.encode_gbps,
            decode_gbps=args.decode_gbps, op_latency_s=args.op_latency_s)
    except SyncSetupError as e:
        raise ValueError(f"{_OPTION_OF.get(e.field, e.field)}: {str(e).split(': ', 1)[1]}") from None
    except ValueError as e:  # unknown fabric: the message starts with "intra:" or "inter:"
        name, _, rest = str(e).partition(": ")
        raise ValueError(f"{_OPTION_OF.get(name, name)}: {rest}") from None
    return setup, label


def format_sync_table(setup: SyncSetup, estimates: dict[str, SyncEstimate], choice: str,
                      label: str = "") -> str:
    """Plain-text table: one row per strategy with seconds, GB moved, effective GB/s (B / seconds) and the
    breakdown; `*` marks `choice`. Formulas follow the table."""
    b = setup.weight_bytes
    head = (f"weight sync {label + ': ' if label else ''}{b / 1e9:.3g} GB per weight set, "
            f"{setup.num_engines} engine(s) x {setup.gpus_per_engine} GPU(s), {setup.engine_nodes} engine "
            f"node(s), intra {setup.intra_gbps:g} GB/s, inter {setup.inter_gbps:g} GB/s")
    cols = ("", "strategy", "seconds", "moved GB", "eff GB/s", "encode s", "transfer s", "decode s", "load s")
    rows = [cols]
    for name, e in estimates.items():
        rows.append(("*" if name == choice else "", name, f"{e.seconds:.3f}", f"{e.bytes_moved / 1e9:.1f}",
                     f"{b / 1e9 / e.seconds:.2f}", f"{e.encode_s:.3f}", f"{e.transfer_s:.3f}",
                     f"{e.decode_s:.3f}", f"{e.load_s:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [head, ""]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    lines += ["", f"* auto -> {choice}", "formulas:"]
    lines += [f"  {name}: {e.notes}" for name, e in estimates.items()]
    return "\n".join(lines)


def plan_sync(args: argparse.Namespace) -> int:
    """`rl-orch plan sync`: print the table; 0, or 2 with a message naming the option on bad input."""
    try:
        setup, label = setup_from_args(args)
    except ValueError as e:
        print(f"plan sync: {e}", file=sys.stderr)
        return 2
    estimates = predict_sync(setup)
    print(format_sync_table(setup, estimates, choose_strategy(setup), label))
    return 0
