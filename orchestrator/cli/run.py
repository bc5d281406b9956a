"""`rl-orch run <config.yaml> [key=value ...]`: load and validate the config, run the GRPO job, print where
its outputs are. The controller runs in a child process watched by this one (orchestrator/cli/watchdog.py:
nothing of the run's local Ray outlives it, even after a SIGKILL); RL_ORCH_NO_WATCHDOG=1 (or `main([...])` from
Python) runs it in-process.

Exit codes: 0 done; 2 a bad config, dataset, placement or memory plan (before any actor starts where it can be
found then); 1 a failure (e.g. a supervised actor failed after run.max_restarts restarts: the message says
what and what to do; a run stopped by its guards: updates skipped in a row,
run.max_skipped_updates, or guards.action=stop); 143 / 130 stopped by SIGTERM / SIGINT (after the step and its checkpoint, or with the
step abandoned: the message says which checkpoint to resume from)."""
from __future__ import annotations

import argparse
import os
import sys

from orchestrator.cli.watchdog import is_child, run_watched
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
    if getattr(args, "watchdog", False) and not is_child() and os.environ.get("RL_ORCH_NO_WATCHDOG") != "1":
        argv = [sys.executable, "-m", "orchestrator", "run", args.config, *args.overrides]
        return run_watched(argv + (["--force"] if args.force else []))
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
    from orchestrator.runtime.stopping import RunStopped, StepAbandoned
    from orchestrator.runtime.supervisor import RunFailedError

    try:
        controller = GRPOController(cfg)
    except (DatasetError, FileNotFoundError, ValueError) as e:  # bad input found before any actor starts
        print(f"input error: {e}", file=sys.stderr)
        return 2
    try:
        result = controller.run()
    except (RunStopped, StepAbandoned) as e:  # SIGTERM / SIGINT
        print(f"stopped: {e}", file=sys.stderr)
        return e.exit_code
    except RunFailedError as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 1
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
