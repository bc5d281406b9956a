"""Command line: `rl-orch run <config.yaml> [key=value ...]` (also `python -m orchestrator ...`) and
`rl-orch plan sync ...` (predictions before a run; see orchestrator/plan_cli.py) and `rl-orch size ...`
(the GPU split from measured phase times; see orchestrator/size_cli.py).

Any config key can be overridden as an OmegaConf dotlist (`rollout.n=8 algo.kl_coef=0.01`); an unknown
key or a bad value fails at once with the key path and the allowed values.
"""
from __future__ import annotations

import argparse
import sys

from orchestrator.config import ConfigError, load_config
from orchestrator.data import DatasetError
from orchestrator.plan_cli import add_plan_parser
from orchestrator.size_cli import add_size_parser


def _run(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *(["memory.force=true"] if args.force else [])]
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from orchestrator.controller import GRPOController
    from orchestrator.memory.preflight import MemoryPlanError
    from orchestrator.placement import PlacementError

    try:
        controller = GRPOController(cfg)
    except (DatasetError, FileNotFoundError, ValueError) as e:  # bad input found before any actor starts
        print(f"input error: {e}", file=sys.stderr)
        return 2
    try:
        result = controller.run()
    except PlacementError as e:
        print(f"placement error: {e}", file=sys.stderr)
        return 2
    except MemoryPlanError as e:  # the pre-flight plan: no actor was started
        print(f"memory error: {e}", file=sys.stderr)
        return 2
    finally:
        controller.shutdown()
    print(f"final checkpoint: {result.checkpoint}")
    print(f"metrics log:      {result.metrics}")
    print(f"plot:             {result.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-orch", description="RL post-training (GRPO) on Ray + vLLM")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a GRPO job from a YAML config")
    run.add_argument("config", help="YAML config file, e.g. configs/grpo_arith_cpu.yaml")
    run.add_argument("overrides", nargs="*", help="key.path=value overrides")
    run.add_argument("--force", action="store_true",
                     help="start even when the pre-flight memory plan says it won't fit (memory.force=true)")
    run.set_defaults(func=_run)
    add_plan_parser(sub)
    add_size_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("run", "plan", "size", "-h", "--help"):
        argv = ["run", *argv]  # `python -m orchestrator cfg.yaml ...` is `rl-orch run cfg.yaml ...`
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage error (2) or --help (0); returned so main() stays callable
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
