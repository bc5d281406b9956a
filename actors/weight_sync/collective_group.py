"""Collective groups for weight sync through `ray.util.collective`.

GPUs use Ray's own `nccl` backend (cupy NCCL communicators). CPUs use `rl_orch_gloo`, registered here
with `ray.util.collective`: a torch gloo process group built from its own TCPStore instead of the
process-wide default group. Ray's built-in `gloo` backend initialises torch's *default* process group,
which the in-process vLLM engine already owns (world size 1), so it cannot join a second group there.
Ours also carries a real operation timeout: a peer that never arrives raises an error after
`timeout_s` instead of hanging.

Every rank calls `join_group(backend, world_size, rank, group_name, timeout_s)` at about the same time
(rank 0 publishes the store address in Ray's internal KV; the others wait for it up to `timeout_s`).
"""
from __future__ import annotations

import datetime
import time

import ray
import ray.experimental.internal_kv as internal_kv
import ray.util.collective as col
import torch
import torch.distributed as dist
from ray.util.collective.backend_registry import BackendRegistry
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import BroadcastOptions

from orchestrator.utils.net import free_port

GLOO_BACKEND = "RL_ORCH_GLOO"
_TIMEOUTS_S: dict[str, float] = {}  # group name -> operation timeout, set by join_group before creation


class StatelessGlooGroup(BaseGroup):
    """A gloo group of `world_size` processes that leaves torch's default process group alone."""

    def __init__(self, world_size: int, rank: int, group_name: str):
        super().__init__(world_size, rank, group_name)
        timeout = datetime.timedelta(seconds=_TIMEOUTS_S.get(group_name, 600.0))
        key = f"rl_orch_gloo_store_{group_name}"
        if rank == 0:
            host, port = ray.util.get_node_ip_address(), free_port()
            store = dist.TCPStore(host, port, world_size, True, timeout=timeout, wait_for_workers=False)
            internal_kv._internal_kv_put(key, f"{host}:{port}", overwrite=True)
        else:
            host, port = self._wait_for_address(key, timeout.total_seconds())
            store = dist.TCPStore(host, port, world_size, False, timeout=timeout)
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), rank, world_size, timeout)
        self._store = store

    @staticmethod
    def _wait_for_address(key: str, timeout_s: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        while (value := internal_kv._internal_kv_get(key)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"weight-sync group: rank 0 did not publish its address ({key}) within {timeout_s:g}s")
            time.sleep(0.05)
        host, port = value.decode().rsplit(":", 1)
        return host, int(port)

    @classmethod
    def backend(cls):
        return GLOO_BACKEND

    @classmethod
    def check_backend_availability(cls) -> bool:
        return dist.is_available() and dist.is_gloo_available()

    def destroy_group(self):
        self._pg = None
        self._store = None

    def broadcast(self, tensors, broadcast_options=BroadcastOptions()):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = broadcast_options.root_rank, 0
        self._pg.broadcast(list(tensors), opts).wait()

    def barrier(self, barrier_options=None):
        self._pg.barrier().wait()

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("the weight-sync gloo group only broadcasts")

    allreduce = reduce = allgather = reducescatter = send = recv = _unsupported


def register_backend() -> None:
    """Make `rl_orch_gloo` known to ray.util.collective in this process (idempotent)."""
    if not BackendRegistry().is_registered(GLOO_BACKEND):  # Ray's registry is a singleton
        col.register_collective_backend(GLOO_BACKEND, StatelessGlooGroup)


def default_backend() -> str:
    """`nccl` where CUDA is available, else our gloo group."""
    return "nccl" if torch.cuda.is_available() else GLOO_BACKEND


def join_group(backend: str, world_size: int, rank: int, group_name: str, timeout_s: float) -> None:
    """Join (or create, for rank 0) the named group; idempotent for a group already joined here."""
    register_backend()
    if col.is_group_initialized(group_name):
        return
    _TIMEOUTS_S[group_name] = timeout_s
    col.init_collective_group(world_size, rank, backend=backend, group_name=group_name)


def leave_group(group_name: str) -> None:
    """Destroy this process's side of the named group (a no-op for a group not joined here)."""
    if col.is_group_initialized(group_name):
        col.destroy_collective_group(group_name)


def broadcast(tensor: torch.Tensor, group_name: str, src_rank: int = 0) -> None:
    """In-place broadcast of `tensor` from `src_rank` over the group; returns when it is complete.

    Ray's NCCL group runs the op on its own CUDA stream, ordered after the default stream but not
    before later work on it: synchronising here keeps the sender from repacking a buffer still being
    sent and the receiver from reading a bucket still arriving.
    """
    col.broadcast(tensor, src_rank=src_rank, group_name=group_name)
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
