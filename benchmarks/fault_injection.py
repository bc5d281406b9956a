"""Faults that change what a step trains on, switched on per step by flag files (benchmarks/faults.py).

Both the fault run and the uninterrupted reference run inject these at the same steps, so that their final
weights can be compared bit for bit; the process faults (kills, a torn checkpoint, a hung engine, a lost node)
are injected in the fault run only.

- `flaky_format`: the `boxed_format` reward, but while the flag `reward_hang` exists every call hangs (the
  scorer's reward.timeout_s kills it: scored 0, counted in reward/timeouts), and while `reward_memory` exists
  every call allocates up to 30 GiB (reward.memory_limit_mb stops it: scored 0, counted in reward/memory_errors).
  As one of two functions its failures are half of the step's calls, which the default
  reward.max_failed_frac=0.5 tolerates.
- the policy loss `ppo_clip_nan_on_flag` (benchmarks/fault_loss.py, an `algo.plugins` entry): `ppo_clip`, times NaN while the
  flag `nan_loss` exists; the trainer skips that update (actor/skipped_updates).

Flags live in FLAGS (a folder every process on this machine sees; RL_ORCH_FAULT_FLAGS overrides it).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

FLAGS = Path(os.environ.get("RL_ORCH_FAULT_FLAGS", "/tmp/rl_orch_fault_flags"))
DATA_FAULTS = ("reward_hang", "reward_memory", "nan_loss")


def set_flags(active: set[str]) -> None:
    """Exactly the flags in `active` (names from DATA_FAULTS) exist afterwards."""
    FLAGS.mkdir(parents=True, exist_ok=True)
    for name in DATA_FAULTS:
        (FLAGS / name).touch() if name in active else (FLAGS / name).unlink(missing_ok=True)


def flaky_format(completions: list[str], answers: list[str]) -> list[float]:
    """`boxed_format`, or a hang / a 30 GiB allocation while the matching flag exists (module docstring)."""
    from orchestrator.reward.functions import boxed_format

    if (FLAGS / "reward_hang").exists():
        while True:
            time.sleep(1)
    if (FLAGS / "reward_memory").exists():
        hog = [bytearray(256 << 20) for _ in range(120)]  # 30 GiB, 256 MiB at a time
        return [float(len(hog))] * len(completions)
    return boxed_format(completions, answers)
