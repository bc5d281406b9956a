"""`rl-orch eval --checkpoint <dir | base> [--config cfg.yaml] [--data SRC] [--out PATH] [key=value ...]`: the
held-out eval metrics (orchestrator/eval, docs/eval.md) of a checkpoint, or of the base model, without training.

The job starts as for a run (rollout workers, reward actor, and the trainer that loads the checkpoint), the
checkpoint's weights go to every engine through a verified weight sync, the eval prompts (`--data`, else the
config's eval.data or eval.holdout) are generated and scored once, then everything stops. The metrics are printed
as a table and written as JSON to `--out` (default `<run.output_dir>/eval.json`; run.output_dir defaults to
runs/eval/<checkpoint name> here, so a training run's folder is never written).

Exit codes: 0 done; 2 a bad config, checkpoint or eval set (before any actor starts); 1 a failure while evaluating.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator.config import ConfigError, load_config
from orchestrator.data import DatasetError


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    """Register `eval` on the top-level subparsers (orchestrator/cli/__init__.py)."""
    p = sub.add_parser("eval", help="held-out eval (pass@k, maj@k, ...) of a checkpoint or the base model")
    p.add_argument("--checkpoint", required=True,
                   help="a checkpoint folder (<checkpoint.dir>/step_<k>), or 'base' for the model itself")
    p.add_argument("--config", default=None, help="the run's YAML config (e.g. runs/<name>/config.yaml)")
    p.add_argument("--data", default=None, help="eval prompts: 'arith' or a .jsonl / .parquet file (sets eval.data)")
    p.add_argument("--out", default=None, help="JSON output file (default <run.output_dir>/eval.json)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides (eval.n=8 eval.temperature=1.0 eval.k=[1,4])")
    p.set_defaults(func=eval_cmd)


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of the command: checkpoint.resume (none for 'base'), eval.data from --data (eval.holdout
    then 0), run.output_dir runs/eval/<checkpoint name> unless given, memory pre-flight off (no training)."""
    base = args.checkpoint in ("base", "none")
    out = [f"checkpoint.resume={'none' if base else str(Path(args.checkpoint).resolve())}", "memory.preflight=false"]
    if args.data:
        out += [f"eval.data={args.data}", "eval.holdout=0"]
    if not any(o.startswith("run.output_dir=") for o in args.overrides):
        out.append(f"run.output_dir=runs/eval/{'base' if base else Path(args.checkpoint).resolve().name}")
    return out + list(args.overrides)


def eval_cmd(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, eval_overrides(args))
        if not cfg.eval.data and cfg.eval.holdout <= 0:
            raise ConfigError("no eval prompts: pass --data (arith or a .jsonl / .parquet file), or set eval.data or "
                              "eval.holdout in the config")
        cfg = load_config(args.config, [*eval_overrides(args), "eval.every_steps=1"])  # on: the eval set is made
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from orchestrator.checkpoint import CheckpointError
    from orchestrator.controller import GRPOController

    try:
        controller = GRPOController(cfg)
    except (CheckpointError, DatasetError, FileNotFoundError, ValueError) as e:
        print(f"input error: {e}", file=sys.stderr)
        return 2
    try:
        metrics = evaluate_checkpoint(controller)
    except Exception as e:  # noqa: BLE001 - reported with its kind; exit 1
        print(f"eval failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        controller.shutdown()
    report = {"checkpoint": args.checkpoint, "model": cfg.model.path, "eval": OmegaConf.to_container(cfg.eval),
              "metrics": metrics}
    out = Path(args.out) if args.out else Path(cfg.run.output_dir) / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(format_table(metrics))
    print(f"written: {out}")
    return 0


def evaluate_checkpoint(controller) -> dict:
    """Start `controller`'s job from its checkpoint (cfg checkpoint.resume; none: the base model at version 0),
    sync the checkpoint's weights to every engine (verified), evaluate once. Returns the eval metrics."""
    job = controller.job
    job.start(controller.resume_from)
    if controller.resume_from is not None:
        state = job.restore(controller.resume_from)
        controller.sync_weights(int(state["step"]), {})
    controller.start_rollouts()
    return controller.evaluator.evaluate(controller)


def format_table(metrics: dict) -> str:
    """Two aligned columns, metric and value, eval/* first in name order, then timing/eval_s."""
    keys = sorted(k for k in metrics if k.startswith("eval/")) + [k for k in metrics if not k.startswith("eval/")]
    width = max(map(len, keys))
    lines = [f"{'metric'.ljust(width)}  value"]
    for k in keys:
        v = metrics[k]
        lines.append(f"{k.ljust(width)}  {v:.4f}" if isinstance(v, float) else f"{k.ljust(width)}  {v}")
    return "\n".join(lines)
