"""Engine side of weight sync: streams of (name, tensor) for the vLLM worker extension to load.

Each function returns an iterator that the extension feeds to vLLM's `reload_weights`, so a bucket or
a shard is loaded while the next one is still arriving, and at most two buckets are held at once.

- `disk_stream(folder, version)`: the shards of one version written by `DiskSender`.
- `broadcast_stream(layout, bucket_mb, version, group)`: buckets from `CollectiveSender`, received by
  a background thread (double buffering: bucket k+1 arrives while bucket k is loaded).
"""
from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from actors.weight_sync import collective
from actors.weight_sync.sender import MANIFEST
from orchestrator.sync.buckets import plan_buckets, unpack_bucket


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


def broadcast_stream(layout: list, bucket_mb: float, version: int, group: str,
                     device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Receive the header and every bucket of one broadcast; yields views into fresh bucket buffers.

    Raises ValueError when the sender's header disagrees with this rank's layout (version, bucket
    count or element count): the two sides would otherwise read each other's bytes as wrong tensors.
    """
    buckets = plan_buckets(layout, bucket_mb)
    header = torch.zeros(3, dtype=torch.int64, device=device)
    collective.broadcast(header, group)
    got = [int(x) for x in header.tolist()]
    want = [version, len(buckets), sum(b.numel for b in buckets)]
    if got != want:
        raise ValueError(f"weight-sync header [version, buckets, elements] = {got}, this engine expects {want}: "
                         "trainer and engine disagree on the layout (bucket_mb or model)")
    inbox: queue.Queue = queue.Queue(maxsize=1)  # one bucket waiting + one being loaded = two buffers

    def receive() -> None:
        try:
            for b in buckets:
                buf = torch.empty(b.numel, dtype=b.dtype, device=device)
                collective.broadcast(buf, group)
                inbox.put((b, buf))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            inbox.put(e)

    thread = threading.Thread(target=receive, name="weight-sync-receive", daemon=True)
    thread.start()
    for _ in buckets:
        item = inbox.get()
        if isinstance(item, BaseException):
            raise item
        bucket, buf = item
        yield from unpack_bucket(buf, bucket)
    thread.join()
