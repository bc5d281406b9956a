"""Disk weight sync: safetensors shards on a path the trainer and every engine share (NFS, a PVC).

The sender writes version v as `<path>/v<v>/shard-*.safetensors` + `manifest.json`, into a temporary
folder first, fsynced and renamed when complete (orchestrator/utils/atomic.py: a reader never sees a
half-written version); older versions are removed once every engine was verified on the new one.
The payload sent to the engines is the folder's path; each engine streams the shards from it.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from actors.weight_sync.base import WeightReceiver, WeightSender, WeightSyncStrategy
from orchestrator.utils.atomic import atomic_dir, is_temporary

MANIFEST = "manifest.json"


class DiskSender(WeightSender):
    """Writes each version as safetensors shards of at most `shard_mb` MiB under `root`."""

    def __init__(self, weights_fn, root: str = "", shard_mb: int = 2048):
        super().__init__(weights_fn)
        self.root, self.shard_bytes = Path(root), shard_mb * 2**20

    def setup(self, ctx):
        super().setup(ctx)
        self.root, self.shard_bytes = Path(ctx.options["path"]), ctx.options["shard_mb"] * 2**20
        return {}

    def send(self, version, engine_versions):
        meta = self.write(version)
        return meta["folder"], meta

    def after_verified(self, version: int) -> None:
        self.prune(version)

    def write(self, version: int) -> dict:
        """Write version `version`; returns meta + {"folder", "files", "write_s"}."""
        named, meta = self.weights_fn("cpu")
        t0 = time.perf_counter()
        final = self.root / f"v{version}"
        with atomic_dir(final) as tmp:
            files = self._write_shards(named, tmp)
            (tmp / MANIFEST).write_text(json.dumps({"version": version, "files": files, "bytes": meta["bytes"]}))
        return {**meta, "folder": str(final), "files": files, "write_s": time.perf_counter() - t0}

    def _write_shards(self, named: list, folder: Path) -> list[str]:
        files, shard, size = [], {}, 0
        for name, t in named + [("", None)]:
            if shard and (t is None or size + t.numel() * t.element_size() > self.shard_bytes):
                files.append(f"shard-{len(files):05d}.safetensors")
                save_file(shard, str(folder / files[-1]))
                shard, size = {}, 0
            if t is not None:
                shard[name], size = t, size + t.numel() * t.element_size()
        return files

    def prune(self, keep_version: int) -> list[str]:
        """Remove every version folder older than `keep_version` and stale temporary folders."""
        removed = []
        for p in self.root.glob("*v*"):
            stale_tmp = p.name.startswith(".v") and is_temporary(p.name)
            old = p.name.startswith("v") and p.name[1:].isdigit() and int(p.name[1:]) < keep_version
            if p.is_dir() and (stale_tmp or old):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        return removed


def disk_stream(folder: str, version: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors of the version in `folder`. Raises FileNotFoundError / ValueError naming the folder when
    the manifest is missing or holds another version."""
    path = Path(folder)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise FileNotFoundError(f"weight-sync folder {path} has no {MANIFEST}: not a complete version")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("version") != version:
        raise ValueError(f"weight-sync folder {path} holds version {manifest.get('version')}, expected {version}")
    for name in manifest["files"]:
        with safe_open(str(path / name), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


class DiskReceiver(WeightReceiver):
    """The payload is the version's folder; shards are read one after another while vLLM loads."""

    def stream(self, payload, version):
        return disk_stream(payload, version)


class DiskStrategy(WeightSyncStrategy):
    sender = DiskSender
    receiver = DiskReceiver

    def options(self, weight_sync_cfg) -> dict:
        return {"path": str(weight_sync_cfg.disk.path), "shard_mb": int(weight_sync_cfg.disk.shard_mb)}

    def metrics(self, meta, reports):
        return {"sync/write_s": meta["write_s"]}


STRATEGY = DiskStrategy()
