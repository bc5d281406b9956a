"""Checkpoint folders: naming, finding the one to resume from (verified against its manifest), pruning.

A checkpoint folder `step_000123/` holds `policy/` (an HF folder that `AutoModelForCausalLM.from_pretrained`
loads, with the tokenizer files), `trainer_state.pt` (optimizer, scheduler, RNG), `state.json` (step, weight
version, data-loader state) and, written last, `manifest.json` (size and sha256 of every other file;
orchestrator/checkpoint/manifest.py). The trainer writes it under a temporary name, fsyncs every file and
folder and renames it when complete; the manifest catches what that cannot: a file torn or changed later.

`checkpoint.resume` (`find_checkpoint`):
- `auto` / `latest`: the newest `step_<k>` under `checkpoint.dir` whose manifest verifies (sizes of every
  folder looked at, sha256 of the one chosen); each newer one that does not is skipped with a warning naming
  the bad file. None verifies: a fresh start (`latest` also warns that it found nothing to resume).
- a path: that folder, which must verify (else CheckpointError naming the file); a folder without a manifest
  (written before manifests) is resumed as it is, with a warning, when its required files are there.
- null / `none` / "": a fresh start.
"""
from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path
from typing import Optional

from orchestrator.checkpoint.manifest import CheckpointError, read_manifest, verify_manifest

REQUIRED = ("policy/config.json", "trainer_state.pt", "state.json")
FRESH = ("none", "")  # and null: checkpoint.resume values that start fresh
SEARCH = ("auto", "latest")  # checkpoint.resume values that search checkpoint.dir
_STEP_NAME = re.compile(r"step_(\d+)")


class CheckpointWarning(UserWarning):
    """A checkpoint skipped or resumed without verification (the message names the folder and the file)."""


def step_folder(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def is_complete(folder: Path) -> bool:
    """Whether the REQUIRED files exist (a checkpoint's shape; `verify_manifest` says whether it is intact)."""
    return all((folder / f).exists() for f in REQUIRED)


def step_folders(root: str | Path) -> list[Path]:
    """Every folder `step_<digits>` under `root`, verified or not, oldest first (by step number, so
    step_1000000 follows step_999999). Other names (a user's `step_000010.bak`, the trainer's temporary
    folders) are ignored: never resumed, never pruned."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_NAME.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def list_checkpoints(root: str | Path) -> list[Path]:
    """The step folders under `root` whose manifest verifies by file sizes (no hashing), oldest first."""
    return [p for p in step_folders(root) if not verify_manifest(p, hashes=False)]


def find_checkpoint(resume: Optional[str], root: str | Path, hashes: bool = True) -> Optional[Path]:
    """The folder that `checkpoint.resume=resume` names (module docstring), None for a fresh start.

    `hashes=False` compares file sizes only. Warns (CheckpointWarning) for each skipped folder and for a
    path without a manifest. Raises FileNotFoundError when a path is not a folder or lacks a REQUIRED file,
    CheckpointError (a ValueError) when a path's manifest does not verify, naming the file."""
    if resume is None or str(resume).strip().lower() in FRESH:
        return None
    if resume in SEARCH:
        return _newest_verified(resume, Path(root), hashes)
    folder = Path(resume)
    missing = [f for f in REQUIRED if not (folder / f).exists()]
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint.resume={resume!r} is not a complete checkpoint (missing {missing}): "
                                "no such folder; the other values are auto, latest and none")
    if missing and read_manifest(folder) is None:
        raise FileNotFoundError(f"checkpoint.resume={resume!r} is not a complete checkpoint (missing {missing})")
    if read_manifest(folder) is None:
        warnings.warn(f"checkpoint.resume={resume!r} has no manifest.json (written before checkpoints had one): "
                      "its files cannot be verified; resuming it as it is", CheckpointWarning, stacklevel=2)
        return folder
    problems = verify_manifest(folder, hashes)
    if problems:
        raise CheckpointError(f"checkpoint.resume={resume!r} does not verify against its manifest: "
                              + "; ".join(problems))
    return folder


def _newest_verified(resume: str, root: Path, hashes: bool) -> Optional[Path]:
    for folder in reversed(step_folders(root)):
        problems = verify_manifest(folder, hashes=False)  # every candidate: sizes only (cheap)
        if not problems and hashes:
            problems = verify_manifest(folder, hashes=True)  # the one chosen: every byte
        if not problems:
            return folder
        warnings.warn(f"checkpoint.resume={resume}: skipping {folder}: " + "; ".join(problems)
                      + ("" if (folder / "manifest.json").exists() else
                         f" (to resume it anyway, name it: checkpoint.resume={folder})"),
                      CheckpointWarning, stacklevel=3)
    if resume == "latest":
        warnings.warn(f"checkpoint.resume=latest: no verified checkpoint under {root}; starting fresh",
                      CheckpointWarning, stacklevel=3)
    return None


def restart_checkpoint(last: str | Path) -> Path:
    """The checkpoint a supervised restart goes back to (orchestrator/runtime/supervisor.py): `last`, the run's newest,
    when its manifest still verifies (every byte), else the newest older `step_<k>` beside it that does, each
    one skipped with a CheckpointWarning naming the bad file. A folder without a manifest (written before
    manifests) is taken as it is when complete. Raises CheckpointError naming every problem when none of them
    verifies (restarting from the base model would silently redo the whole run)."""
    last = Path(last)
    match = _STEP_NAME.fullmatch(last.name)
    older = [p for p in step_folders(last.parent)
             if match and p != last and int(_STEP_NAME.fullmatch(p.name).group(1)) < int(match.group(1))]
    found = []
    for folder in [last, *reversed(older)]:
        if read_manifest(folder) is None:
            if is_complete(folder):
                return folder
            problems = [f"{folder}: no manifest.json and missing {[f for f in REQUIRED if not (folder / f).exists()]}"]
        else:
            problems = verify_manifest(folder, hashes=True)
        if not problems:
            return folder
        found += problems
        warnings.warn(f"restart: skipping checkpoint {folder}: " + "; ".join(problems), CheckpointWarning,
                      stacklevel=2)
    raise CheckpointError(f"restart: no checkpoint at or before {last} verifies: " + "; ".join(found)
                          + "; nothing to restart from (the run's outputs are left as they are)")


def prune_checkpoints(root: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` verified checkpoints (keep_last <= 0 keeps all). Torn folders
    and folders without a manifest are left alone: a torn newest one never costs a good one."""
    if keep_last <= 0:
        return
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
