"""`python -m orchestrator.checkpoint.upgrade <folder> [<folder> ...]`: make a checkpoint written by an older
rl-orchestrator resumable, once, for a folder you trust.

- `trainer_state.pt` that the safe loader refuses (its LR scheduler state carried the `inspect.Signature` of a
  Ray actor method): read ONCE with the unsafe loader, because you vouch for the file, its scheduler
  `lr_lambdas` entries replaced by None (LambdaLR then keeps the multiplier the trainer builds), rewritten
  in place (fsynced, atomic rename) and read back with the safe loader.
- no `manifest.json`: one is written over the files as they are (step from `state.json`; the base model path
  unknown, so left empty), so that `checkpoint.resume=auto | latest` will consider the folder.

Never run it on a checkpoint of unknown origin: reading it unsafely can run code. Imports torch; no Ray.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path

import torch

from orchestrator.utils.atomic import fsync_tree
from orchestrator.checkpoint.manifest import CheckpointError, read_manifest, write_manifest
from orchestrator.checkpoint.state import load_trainer_state


OLD_SCHEDULER_CLASSES = [inspect.Signature, inspect.Parameter, type(inspect.Parameter.POSITIONAL_ONLY), inspect.Parameter.empty]


def upgrade(folder: str | os.PathLike) -> list[str]:
    """Upgrade checkpoint `folder` in place (module docstring); returns what was changed ([] = nothing to do).
    Raises CheckpointError when the converted state still does not load safely."""
    folder = Path(folder)
    changed = []
    path = folder / "trainer_state.pt"
    try:
        load_trainer_state(path, mmap=True)
    except CheckpointError:
        # still the safe loader: only the classes old scheduler states hold (Ray's `__signature__` on the
        # bound LR lambda) are allowed, and they are dropped below
        with torch.serialization.safe_globals(OLD_SCHEDULER_CLASSES):
            state = torch.load(path, weights_only=True)
        sched = state.get("scheduler") or {}
        if "lr_lambdas" in sched:
            sched["lr_lambdas"] = [None] * len(sched["lr_lambdas"])
        tmp = path.with_name(path.name + ".upgrade")
        torch.save(state, tmp)
        os.replace(tmp, path)
        load_trainer_state(path, mmap=True)  # raises if something unsafe is still in it
        changed.append(f"{path}: scheduler state made plain (loads with weights_only=True)")
    if read_manifest(folder) is None:
        step = json.loads((folder / "state.json").read_text()).get("step", 0)
        write_manifest(folder, step=step, base_model="")
        changed.append(f"{folder / 'manifest.json'}: written (step {step})")
    fsync_tree(folder)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.checkpoint.upgrade", description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", help="checkpoint folders (step_<k>) you trust")
    args = parser.parse_args(argv)
    for folder in args.folders:
        try:
            changes = upgrade(folder)
        except (CheckpointError, OSError) as e:
            print(f"{folder}: not upgraded: {e}", file=sys.stderr)
            return 1
        print("\n".join(changes) if changes else f"{folder}: already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
