"""Command line: `rl-orch run <config.yaml> [key=value ...]` (also `python -m orchestrator ...`; run.py),
`rl-orch plan sync ...` and `rl-orch plan memory ...` (predictions before a run; plan_sync.py, plan_memory.py)
`rl-orch size ...` (the GPU split from measured phase times; size.py), `rl-orch eval ...` (held-out eval of a
checkpoint or the base model, no training; eval.py) and `rl-orch drain ...` (Ray nodes about to go: an elastic run's
engines there leave first; drain.py). One module per command.

Any config key can be overridden as an OmegaConf dotlist (`rollout.n=8 algo.kl_coef=0.01`); an unknown
key or a bad value fails at once with the key path and the allowed values.
"""
from __future__ import annotations

import argparse
import sys

from orchestrator.cli.drain import add_drain_parser
from orchestrator.cli.eval import add_eval_parser
from orchestrator.cli.plan_sync import add_plan_parser
from orchestrator.cli.run import add_run_parser
from orchestrator.cli.size import add_size_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-orch", description="RL post-training (GRPO) on Ray + vLLM")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_plan_parser(sub)
    add_size_parser(sub)
    add_eval_parser(sub)
    add_drain_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line (argv None: sys.argv; `rl-orch run` then watches its controller in a child process,
    orchestrator/cli/watchdog.py), or `main([...])` from Python (in-process, e.g. tests)."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("run", "plan", "size", "eval", "drain", "-h", "--help"):
        argv = ["run", *argv]  # `python -m orchestrator cfg.yaml ...` is `rl-orch run cfg.yaml ...`
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage error (2) or --help (0); returned so main() stays callable
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    args.watchdog = from_command_line
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
