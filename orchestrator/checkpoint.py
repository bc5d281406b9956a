"""Checkpoint folders: naming, finding the latest complete one, pruning old ones.

A checkpoint folder `step_000123/` holds `policy/` (an HF folder that
`AutoModelForCausalLM.from_pretrained` loads), `trainer_state.pt` (optimizer, scheduler, RNG) and
`state.json` (step, weight version, data-loader state). The trainer writes it under a temporary
name and renames it when complete, so a crash never leaves a half-written `step_*` folder.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

REQUIRED = ("policy/config.json", "trainer_state.pt", "state.json")


def step_folder(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def is_complete(folder: Path) -> bool:
    return all((folder / f).exists() for f in REQUIRED)


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and is_complete(p))


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
