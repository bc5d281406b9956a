"""Atomic folder writes: fill a temporary folder beside the final one, fsync it, rename it into place.

    with atomic_dir("/ckpt/step_10") as tmp:
        (tmp / "state.json").write_text("...")
    # /ckpt/step_10 now holds exactly what was written, or is unchanged if the block raised

A reader never sees a half-written folder: the rename (os.replace) is atomic on one filesystem. Used by
the disk weight sync (actors/weight_sync/disk.py) and the trainers' checkpoints (actors/trainer/trainer.py,
actors/trainer/sharded.py). Pure (standard library only).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_dir(final: str | os.PathLike, fsync: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary folder `.<name>.tmp-*` beside `final` (parents created). When the block
    ends normally: every file and folder in it is fsynced (`fsync=True`), an existing `final` is removed,
    the temporary folder is renamed to `final` and the parent folder is fsynced (the rename is durable).
    When the block raises: the temporary folder is removed and the exception propagates; `final` is
    untouched."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        if fsync:
            fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        if fsync:
            _fsync_path(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fsync_tree(folder: Path) -> None:
    """fsync every regular file and every folder under `folder`, and `folder` itself (the files' data and
    the folders' entries reach the disk before the rename)."""
    for p in sorted(folder.rglob("*")):
        if p.is_file() or p.is_dir():
            _fsync_path(p)
    _fsync_path(folder)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """Whether `name` is a temporary folder left by an interrupted `atomic_dir` (".<final>.tmp-...")."""
    return name.startswith(".") and ".tmp-" in name
