"""The `checkpoint` section of the run config: where checkpoints go, how often (steps, minutes), how many are
kept, what a run resumes from and whether a signal checkpoints before the exit (orchestrator/checkpoint,
docs/checkpointing.md). Its fields state their ranges; no check involves other sections.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.config.fields import number


@dataclass
class CheckpointConfig:
    dir: str = "${run.output_dir}/checkpoints"  # follows run.output_dir (default runs/${run.name}/checkpoints)
    every_steps: int = number(0, ge=0, finite=True)  # 0 = off (the last step is always checkpointed)
    # a checkpoint after the step in which this many minutes passed since the last one (bounds the work a
    # crash or preemption loses); 0 = off
    every_minutes: float = number(30.0, ge=0, finite=True)
    keep_last: int = 2
    # auto | latest: the newest checkpoint under `dir` whose manifest verifies (none: a fresh start; latest
    # also warns); a checkpoint folder; none / null: a fresh start
    resume: Optional[str] = "auto"
    # On SIGTERM/SIGINT (scancel, pod eviction, Ctrl-C) the current step finishes, then a checkpoint is
    # written (unless the step just wrote one) before the run exits (code 143 / 130); false: exit without one.
    on_signal: bool = True
