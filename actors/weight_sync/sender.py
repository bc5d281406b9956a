"""Trainer side of weight sync: one small class per strategy over the trainer's named tensors.

Every sender gets `weights_fn(device)` -> (named tensors in the engines' dtype, expected meta
{"groups": checksums, "bytes": int}); the receivers live in `vllm_extension.py`.

- `DiskSender`: safetensors shards under `<root>/v<version>/`, written into a temporary folder,
  fsynced, then renamed (a reader never sees a half-written version); `prune` removes older ones.
- `CollectiveSender`: bucketed broadcast over a ray.util.collective group (NCCL on GPUs, gloo on
  CPU); packing bucket k+1 overlaps sending bucket k (two buffers, one packing thread).
- `DeltaSender`: XOR + zstd against the last version sent (`orchestrator.sync.delta`).
- The object-store strategy needs no sender: the named tensors are returned to Ray as they are.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors.torch import save_file

from actors.weight_sync import collective
from orchestrator.sync.buckets import pack_bucket, plan_buckets, tensor_specs
from orchestrator.sync.delta import DeltaPayload, encode_delta

WeightsFn = Callable[[str], tuple[list[tuple[str, torch.Tensor]], dict]]
MANIFEST = "manifest.json"


class DiskSender:
    """Writes a version as safetensors shards of at most `shard_mb` MiB."""

    def __init__(self, weights_fn: WeightsFn, root: str, shard_mb: int):
        self.weights_fn, self.root, self.shard_bytes = weights_fn, Path(root), shard_mb * 2**20

    def write(self, version: int) -> dict:
        """Write version `version`; returns meta + {"folder", "files", "write_s"}."""
        named, meta = self.weights_fn("cpu")
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"v{version}"
        tmp = Path(tempfile.mkdtemp(prefix=f".v{version}.tmp-", dir=self.root))
        try:
            files = self._write_shards(named, tmp)
            (tmp / MANIFEST).write_text(json.dumps({"version": version, "files": files, "bytes": meta["bytes"]}))
            _fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {**meta, "folder": str(final), "files": files, "write_s": time.perf_counter() - t0}

    def _write_shards(self, named: list, folder: Path) -> list[str]:
        files, shard, size = [], {}, 0
        for name, t in named + [("", None)]:
            if shard and (t is None or size + t.numel() * t.element_size() > self.shard_bytes):
                files.append(f"shard-{len(files):05d}.safetensors")
                save_file(shard, str(folder / files[-1]))
                _fsync(folder / files[-1])
                shard, size = {}, 0
            if t is not None:
                shard[name], size = t, size + t.numel() * t.element_size()
        return files

    def prune(self, keep_version: int) -> list[str]:
        """Remove every version folder older than `keep_version` and stale temporary folders."""
        removed = []
        for p in self.root.glob("*v*"):
            stale_tmp = p.name.startswith(".v") and ".tmp-" in p.name
            old = p.name.startswith("v") and p.name[1:].isdigit() and int(p.name[1:]) < keep_version
            if p.is_dir() and (stale_tmp or old):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        return removed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    for p in folder.iterdir():
        _fsync(p)


class CollectiveSender:
    """Rank 0 of a weight-sync group: broadcasts the weights bucket by bucket."""

    def __init__(self, weights_fn: WeightsFn, bucket_mb: float, backend: Optional[str] = None):
        self.weights_fn, self.bucket_mb = weights_fn, bucket_mb
        self.backend = backend or collective.default_backend()
        self.device = "cuda" if self.backend.lower() == "nccl" else "cpu"
        self.group: Optional[str] = None

    def layout(self) -> list:
        """(name, shape, dtype) of every tensor sent, in order; every receiver plans the same buckets."""
        named, _ = self.weights_fn("cpu")
        return tensor_specs(named)

    def join(self, world_size: int, group_name: str, timeout_s: float) -> None:
        collective.join_group(self.backend, world_size, 0, group_name, timeout_s)
        self.group = group_name

    def broadcast(self, version: int) -> dict:
        """Send a header [version, buckets, elements], then every bucket. Returns meta + timings."""
        if self.group is None:
            raise RuntimeError("CollectiveSender.broadcast before join(): the weight-sync group is not set up")
        named, meta = self.weights_fn(self.device)
        tensors = dict(named)
        buckets = plan_buckets(tensor_specs(named), self.bucket_mb)
        header = torch.tensor([version, len(buckets), sum(b.numel for b in buckets)], dtype=torch.int64,
                              device=self.device)
        collective.broadcast(header, self.group)
        t0 = time.perf_counter()
        largest = max(b.numel for b in buckets)
        buffers = [torch.empty(largest, dtype=buckets[0].dtype, device=self.device) for _ in range(2)]
        with ThreadPoolExecutor(max_workers=1) as packer:
            pending = packer.submit(pack_bucket, tensors, buckets[0], self._buffer(buffers, 0, buckets[0]))
            for k, bucket in enumerate(buckets):
                ready = pending.result()
                if k + 1 < len(buckets):  # pack the next bucket while this one is on the wire
                    nxt = buckets[k + 1]
                    pending = packer.submit(pack_bucket, tensors, nxt, self._buffer(buffers, k + 1, nxt))
                collective.broadcast(ready, self.group)
        return {**meta, "buckets": len(buckets), "wire_s": time.perf_counter() - t0}

    @staticmethod
    def _buffer(buffers: list, k: int, bucket) -> torch.Tensor:
        buf = buffers[k % 2]
        if buf.dtype != bucket.dtype:  # a layout with mixed dtypes: reinterpret is wrong, allocate
            buf = torch.empty(bucket.numel, dtype=bucket.dtype, device=buf.device)
        return buf


class DeltaSender:
    """Keeps the last version sent and encodes the next one against it."""

    def __init__(self, weights_fn: WeightsFn, level: int = 3):
        self.weights_fn, self.level = weights_fn, level
        self.base: Optional[dict[str, torch.Tensor]] = None
        self.base_version: Optional[int] = None

    def encode(self, version: int, max_changed_fraction: float, force_full: bool = False):
        """Returns (payload or None, stats). None: engines need a full sync (no base yet, forced, or
        more than `max_changed_fraction` of the elements changed). The new version becomes the base."""
        named, meta = self.weights_fn("cpu")
        new = {n: t.clone() for n, t in named}  # never alias live parameters: the optimizer moves them
        payload: Optional[DeltaPayload] = None
        stats = {**meta, "base_version": self.base_version, "full_reason": None, "encode_s": 0.0}
        if self.base is None or force_full:
            stats["full_reason"] = "no base version" if self.base is None else "forced full sync"
        else:
            t0 = time.perf_counter()
            payload = encode_delta(self.base, new, self.base_version, version, self.level)
            stats.update(encode_s=time.perf_counter() - t0, changed_fraction=payload.changed_fraction,
                         delta_bytes=payload.nbytes)
            if payload.changed_fraction > max_changed_fraction:
                stats["full_reason"] = f"changed fraction {payload.changed_fraction:.3f} > {max_changed_fraction}"
                payload = None
        self.base, self.base_version = new, version
        return payload, stats
