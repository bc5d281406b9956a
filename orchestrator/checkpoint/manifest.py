"""The checkpoint manifest: `manifest.json`, written last into a checkpoint folder, lists every other file
with its size and sha256, the format version, the step and the model it holds.

    manifest = write_manifest(folder, step=10, base_model="/models/x")   # after every other file
    problems = verify_manifest(folder, hashes=True)                       # [] = intact

A folder whose manifest is missing, unreadable, or disagrees with a file (missing, truncated, grown, a
changed byte, an extra file) is torn: `verify_manifest` names each bad file and what is wrong with it.
Pure (standard library only).
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from orchestrator.checkpoint.compat import model_identity

MANIFEST = "manifest.json"
FORMAT_VERSION = 1  # bumped when a reader of this version could not load a newer checkpoint
_CHUNK = 8 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: torn, of another format version, of another model, or unsafe."""


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 8 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_files(paths: list[Path]) -> list[str]:
    """`file_sha256` of each path, several files at once (hashlib releases the GIL: one core per file)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(paths)))) as pool:
        return list(pool.map(file_sha256, paths))


def listed_files(folder: Path) -> list[str]:
    """Every regular file under `folder` but the manifest, as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST)


def write_manifest(folder: str | os.PathLike, *, step: int, base_model: str) -> dict:
    """Hash every file of `folder` and write `folder/manifest.json`; call it after every other file is written.

    The manifest: {"format_version", "step", "model": {"base_path": `base_model`, "identity":
    model_identity(policy/config.json)}, "files": {relative path: {"size": bytes, "sha256": hex}}}.
    Returns it. Raises FileNotFoundError when `folder/policy/config.json` is missing."""
    folder = Path(folder)
    names = listed_files(folder)
    digests = hash_files([folder / rel for rel in names])
    files = {rel: {"size": (folder / rel).stat().st_size, "sha256": h} for rel, h in zip(names, digests)}
    manifest = {"format_version": FORMAT_VERSION, "step": int(step),
                "model": {"base_path": str(base_model), "identity": model_identity(folder / "policy" / "config.json")},
                "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(folder: str | os.PathLike) -> Optional[dict]:
    """The parsed manifest of `folder`, or None when it has none. Raises CheckpointError (naming the file)
    when it is not valid JSON or lacks "format_version" / "files"."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "format_version" not in manifest:
        raise CheckpointError(f"{path}: not a checkpoint manifest (no format_version / files)")
    return manifest


def verify_manifest(folder: str | os.PathLike, hashes: bool = True) -> list[str]:
    """What is wrong with checkpoint `folder` against its manifest, one line per bad file ([] = intact).

    Sizes are always compared; sha256 too when `hashes` and every size is right (several files hashed at
    once; 1.6 GB, the default model's checkpoint, took 3.1 s on a loaded 2-core host). A missing
    manifest, one of a newer format version, a listed file missing or of another size or content, and a
    file the manifest does not list are each a problem. Never raises for a torn folder."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except CheckpointError as e:
        return [str(e)]
    if manifest is None:
        return [f"{folder / MANIFEST}: missing (the checkpoint was not completely written, or predates manifests)"]
    if manifest["format_version"] > FORMAT_VERSION:
        return [f"{folder / MANIFEST}: format version {manifest['format_version']} is newer than this "
                f"rl-orchestrator reads ({FORMAT_VERSION}); resume it with the version that wrote it"]
    listed = sorted(manifest["files"].items())
    problems = [_check_size(folder / rel, want) for rel, want in listed]
    problems += [f"{folder / rel}: not in the manifest" for rel in listed_files(folder) if rel not in manifest["files"]]
    if hashes and not any(problems):  # every size right: now every byte
        digests = hash_files([folder / rel for rel, _ in listed])
        problems = [f"{folder / rel}: content changed (sha256 differs from the manifest's)"
                    for (rel, want), h in zip(listed, digests) if h != want["sha256"]]
    return [p for p in problems if p]


def _check_size(path: Path, want: dict) -> str:
    if not path.is_file():
        return f"{path}: missing"
    size = path.stat().st_size
    if size != want["size"]:
        kind = "truncated" if size < want["size"] else "grown"
        return f"{path}: {kind}, {size} bytes where the manifest says {want['size']}"
    return ""
