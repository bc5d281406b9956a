"""`rl-orch run <config.yaml> [key=value ...]`: load and validate the config, run the GRPO job, print where
its outputs are. Exit code 2 with a message naming the input for a bad config, dataset, placement or memory
plan (before any actor starts where it can be found then); exit code 1 with the message for a run stopped by its
guards (updates skipped in a row: run.max_skipped_updates; guards.action=stop)."""
from __future__ import annotations

import argparse
import sys

from orchestrator.config import ConfigError, load_config
from orchestrator.data import DatasetError


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    """Register `run` on the top-level subparsers (orchestrator/cli/__init__.py)."""
    run = sub.add_parser("run", help="run a GRPO job from a YAML config")
    run.add_argument("config", help="YAML config file, e.g. configs/grpo_arith_cpu.yaml")
    run.add_argument("overrides", nargs="*", help="key.path=value overrides")
    run.add_argument("--force", action="store_true",
                     help="start even when the pre-flight memory plan says it won't fit (memory.force=true)")
    run.set_defaults(func=run_cmd)


def run_cmd(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *(["memory.force=true"] if args.force else [])]
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from orchestrator.controller import GRPOController
    from orchestrator.guards import DivergedError, GuardTripped
    from orchestrator.memory.preflight import MemoryPlanError
    from orchestrator.placement.groups import PlacementError

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
    except (DivergedError, GuardTripped) as e:  # run.max_skipped_updates, guards.action=stop (orchestrator/guards)
        print(f"run stopped: {e}", file=sys.stderr)
        return 1
    finally:
        controller.shutdown()
    print(f"final checkpoint: {result.checkpoint}")
    print(f"metrics log:      {result.metrics}")
    print(f"plot:             {result.plot}")
    return 0
