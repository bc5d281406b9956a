"""Checkpoint folders: naming, finding the latest complete one, pruning old ones.

A checkpoint folder `step_000123/` holds `policy/` (an HF folder that
`AutoModelForCausalLM.from_pretrained` loads), `trainer_state.pt` (optimizer, scheduler, RNG) and
`state.json` (step, weight version, data-loader state). The trainer writes it under a temporary
name and renames it when complete, so a crash never leaves a half-written `step_*` folder.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

REQUIRED = ("policy/config.json", "trainer_state.pt", "state.json")
_STEP_NAME = re.compile(r"step_(\d+)")


def step_folder(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def is_complete(folder: Path) -> bool:
    return all((folder / f).exists() for f in REQUIRED)


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints `step_<digits>` under `root`, oldest first (by step number, so step_1000000
    follows step_999999). Other names (a user's `step_000010.bak`, the trainer's temporary folders) are
    ignored: never chosen as "latest", never pruned."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_NAME.fullmatch(p.name)) and p.is_dir() and is_complete(p)]
    return [p for _, p in sorted(found)]


def find_checkpoint(resume: Optional[str], root: str | Path) -> Optional[Path]:
    """The folder to resume from: None, "latest" (newest complete under `root`, or None) or a path.

    Raises FileNotFoundError when `resume` names a folder that is not a complete checkpoint.
    """
    if not resume:
        return None
    if resume == "latest":
        found = list_checkpoints(root)
        return found[-1] if found else None
    folder = Path(resume)
    if not is_complete(folder):
        missing = [f for f in REQUIRED if not (folder / f).exists()]
        raise FileNotFoundError(f"checkpoint.resume={resume!r} is not a complete checkpoint (missing {missing})")
    return folder


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (keep_last <= 0 keeps all)."""
    if keep_last <= 0:
        return
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
