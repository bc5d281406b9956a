"""Collective weight sync (strategy "nccl"): a bucketed broadcast from trainer rank 0 over a
ray.util.collective group, NCCL on GPUs and our gloo group on CPU (actors/weight_sync/collective_group.py).

Setup: the sender picks the backend and a fresh group name and sends the tensor layout (name, shape,
dtype of every tensor, in order); every engine's tensor-parallel worker joins as rank 1 + k*t + its TP
rank (engine k, t = rollout.tensor_parallel_size) while the trainer joins as rank 0, and all sides plan
the same buckets of `weight_sync.bucket_mb` MiB. A sync: a header [version, buckets, elements], then
every bucket; the sender packs bucket k+1 while bucket k is on the wire (two buffers, one packing
thread), and each receiver loads bucket k while bucket k+1 arrives (a background thread).
"""
from __future__ import annotations

import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Optional

import torch

from actors.weight_sync import base, collective_group
from actors.weight_sync.base import WeightReceiver, WeightSender, WeightSyncStrategy
from orchestrator.weight_sync.buckets import pack_bucket, plan_buckets, tensor_specs, unpack_bucket


class CollectiveSender(WeightSender):
    """Rank 0 of a weight-sync group: broadcasts the weights bucket by bucket."""

    def __init__(self, weights_fn, bucket_mb: float = 256, backend: Optional[str] = None):
        super().__init__(weights_fn)
        self.bucket_mb = bucket_mb
        self.backend = backend or collective_group.default_backend()
        self.device = "cuda" if self.backend.lower() == "nccl" else "cpu"
        self.group: Optional[str] = None

    def setup(self, ctx):
        """info: {"backend", "group", "world_size", "timeout_s", "layout", "bucket_mb", "tensor_parallel_size"}."""
        super().setup(ctx)
        self.bucket_mb = ctx.options["bucket_mb"]
        return {"backend": self.backend, "group": f"rl_orch_sync_{uuid.uuid4().hex[:8]}",
                "world_size": 1 + ctx.engines * ctx.tensor_parallel_size, "timeout_s": ctx.timeout_s,
                "layout": self.layout(), "bucket_mb": self.bucket_mb, "tensor_parallel_size": ctx.tensor_parallel_size}

    def connect(self, info):
        self.join(info["world_size"], info["group"], info["timeout_s"])

    def send(self, version, engine_versions):
        return None, self.broadcast(version)

    def layout(self) -> list:
        """(name, shape, dtype) of every tensor sent, in order; every receiver plans the same buckets."""
        named, _ = self.weights_fn("cpu")
        return tensor_specs(named)

    def join(self, world_size: int, group_name: str, timeout_s: float) -> None:
        collective_group.join_group(self.backend, world_size, 0, group_name, timeout_s)
        self.group = group_name

    def close(self) -> None:
        if self.group is not None:
            collective_group.leave_group(self.group)
            self.group = None

    def broadcast(self, version: int) -> dict:
        """Send a header [version, buckets, elements], then every bucket. Returns meta + {"buckets", "wire_s"}.
        Raises RuntimeError before `join`. A failed broadcast (a member lost) destroys this side of the group
        first: the members waiting on rank 0 then get an error at once instead of waiting out the group's timeout
        (gloo reports a peer's death only on the connections that peer held); the syncer re-forms the group."""
        if self.group is None:
            raise RuntimeError("CollectiveSender.broadcast before join(): the weight-sync group is not set up")
        try:
            return self._broadcast(version)
        except BaseException:
            self.close()
            raise

    def _broadcast(self, version: int) -> dict:
        named, meta = self.weights_fn(self.device)
        tensors = dict(named)
        buckets = plan_buckets(tensor_specs(named), self.bucket_mb)
        header = torch.tensor([version, len(buckets), sum(b.numel for b in buckets)], dtype=torch.int64,
                              device=self.device)
        collective_group.broadcast(header, self.group)
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
                collective_group.broadcast(ready, self.group)
        return {**meta, "buckets": len(buckets), "wire_s": time.perf_counter() - t0}

    @staticmethod
    def _buffer(buffers: list, k: int, bucket) -> torch.Tensor:
        buf = buffers[k % 2]
        if buf.dtype != bucket.dtype:  # a layout with mixed dtypes: reinterpret is wrong, allocate
            buf = torch.empty(bucket.numel, dtype=bucket.dtype, device=buf.device)
        return buf


def broadcast_stream(layout: list, bucket_mb: float, version: int, group: str, device: str = "cpu",
                     on_broken: Callable[[], None] = lambda: None) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive the header and every bucket of one broadcast; yields views into fresh bucket buffers.

    Raises ValueError when the sender's header disagrees with this rank's layout (version, bucket
    count or element count): the two sides would otherwise read each other's bytes as wrong tensors.
    A broadcast that fails (a member lost) calls `on_broken` once no receive is in flight, then raises.
    """
    buckets = plan_buckets(layout, bucket_mb)
    header = torch.zeros(3, dtype=torch.int64, device=device)
    try:
        collective_group.broadcast(header, group)
    except BaseException:
        on_broken()
        raise
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
                collective_group.broadcast(buf, group)
                inbox.put((b, buf))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            inbox.put(e)

    thread = threading.Thread(target=receive, name="weight-sync-receive", daemon=True)
    thread.start()
    try:
        for _ in buckets:
            item = inbox.get()
            if isinstance(item, BaseException):
                thread.join()  # the receiving thread ends after handing its error over
                on_broken()
                raise item
            bucket, buf = item
            yield from unpack_bucket(buf, bucket)
        thread.join()
    finally:
        if thread.is_alive():  # the loader stopped early (closed here): the rest is received and dropped, so the
            _drain(inbox, thread)  # broadcast completes for every member and the group stays whole


def _drain(inbox: queue.Queue, thread: threading.Thread) -> None:
    """Take and drop what the receiving thread hands over until it ends (all buckets received, or its error)."""
    while thread.is_alive() or not inbox.empty():
        try:
            inbox.get(timeout=0.1)
        except queue.Empty:
            continue
    thread.join()


class CollectiveReceiver(WeightReceiver):
    """One tensor-parallel worker of engine k: rank 1 + k*t + its TP rank of the group."""

    def __init__(self):
        self.group: Optional[tuple] = None  # (group name, layout, bucket_mb, device of the buckets)

    def connect(self, info, engine_index):
        rank = 1 + engine_index * info["tensor_parallel_size"] + base.tp_position()[0]
        collective_group.join_group(info["backend"], info["world_size"], rank, info["group"], info["timeout_s"])
        device = "cuda" if info["backend"].lower() == "nccl" else "cpu"
        self.group = (info["group"], info["layout"], info["bucket_mb"], device)

    def stream(self, payload, version):
        if self.group is None:
            raise RuntimeError("a broadcast before connect: this engine is not in the weight-sync group")
        group, layout, bucket_mb, device = self.group
        # a failed broadcast leaves the group at once: members waiting on this one get an error, not a hang
        return broadcast_stream(layout, bucket_mb, version, group, device, on_broken=self.close)

    def receive(self, payload, version, load) -> None:
        """`load(stream(...))`; a loader that raises part-way (a tensor it cannot take) closes the stream, which
        receives and drops the rest of the broadcast: the trainer and the other engines finish theirs, and only
        this engine's load fails (its error raised), instead of every member waiting out the group's timeout."""
        pairs = self.stream(payload, version)
        try:
            load(pairs)
        finally:
            pairs.close()

    def close(self) -> None:
        if self.group is not None:
            collective_group.leave_group(self.group[0])
            self.group = None


class CollectiveStrategy(WeightSyncStrategy):
    sender = CollectiveSender
    receiver = CollectiveReceiver
    concurrent = True  # receivers meet the sender on the wire: launched together, payload None

    def options(self, weight_sync_cfg) -> dict:
        return {"bucket_mb": weight_sync_cfg.bucket_mb}

    def metrics(self, meta, reports):
        return {"sync/buckets": meta["buckets"], "sync/wire_s": meta["wire_s"]}


STRATEGY = CollectiveStrategy()
