"""vLLM's own NCCL weight transfer (strategy "vllm_nccl"): the broadcast of vLLM's `NCCLWeightTransferEngine`.

The engine side is vLLM's engine itself, built through vLLM's factory by our transfer engine
(actors/weight_sync/transfer_engine.py, `StrategyTransferEngine.vllm_engine`) with a model whose `load_weights`
passes every unpacked chunk through our checksums into the real model; the trainer side is vLLM's trainer primitives
(`nccl_common.trainer_init`: rank 0 of a `StatelessProcessGroup` rendezvous over a TCP store, then a
`PyNcclCommunicator`; `packed_nccl_broadcast_producer`: the weights packed into double-buffered chunks of
`weight_sync.bucket_mb` MiB on their own CUDA streams). Our verification stays on top: every engine's version,
checksums of what its loader consumed and the logprob probe.

Unlike strategy "nccl" (a `ray.util.collective` group, gloo on CPU), it needs no Ray in the engine's process, so it
also serves rollout.engine=async_llm, and it needs no cupy; it needs CUDA on the trainer and every engine (vLLM's
PyNccl). Ranks: the trainer 0, engine k's tensor-parallel worker r at 1 + k*t + r (t = tensor_parallel_size).
"""
from __future__ import annotations

import torch

from orchestrator.utils.net import free_port
from actors.weight_sync.base import WeightSender, WeightSyncStrategy
from actors.weight_sync.vllm_native import VLLMEngineReceiver
from orchestrator.weight_sync.buckets import tensor_specs

NUM_BUFFERS = 2  # chunks in flight: one packed while one is on the wire


def node_address() -> str:
    """This host's address as the engines reach it (Ray's view of the node; the hostname's outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - no Ray here: the hostname's address
        import socket

        return socket.gethostbyname(socket.gethostname())


def check_against_layout(named: list[tuple[str, torch.Tensor]], layout: list) -> None:
    """Raises ValueError naming the first tensor whose name, shape or dtype differs from `layout` (what every engine
    was told at connect), or a count that differs: the two sides would cut the packed stream differently and hang
    in NCCL or load wrong bytes."""
    if len(named) != len(layout):
        raise ValueError(f"weight sync (vllm_nccl): the trainer sends {len(named)} tensors, the engines expect "
                         f"{len(layout)} (the layout sent at connect)")
    for i, ((name, t), (want_name, shape, dtype)) in enumerate(zip(named, layout)):
        if name != want_name or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise ValueError(f"weight sync (vllm_nccl): tensor {i} is {name!r} {tuple(t.shape)} {t.dtype}, the "
                             f"engines expect {want_name!r} {tuple(shape)} {dtype}")


class VLLMNcclSender(WeightSender):
    """Rank 0: opens the rendezvous, then broadcasts each version packed."""

    def __init__(self, weights_fn):
        super().__init__(weights_fn)
        self.group = None  # vLLM's PyNcclCommunicator, after connect
        self.layout: list = []
        self.info: dict = {}

    def setup(self, ctx):
        """info: {"master_address", "master_port", "world_size", "tensor_parallel_size", "layout",
        "buffer_bytes", "num_buffers"}. Raises VLLMAPIError when an API it uses changed, RuntimeError without CUDA on
        the trainer."""
        super().setup(ctx)
        from actors.rollout.vllm_compat import NCCL, check_vllm_api

        check_vllm_api(also=NCCL)  # the vLLM APIs this strategy uses, named if changed (before any group forms)
        if not torch.cuda.is_available():
            raise RuntimeError("weight_sync.strategy=vllm_nccl needs CUDA GPUs on the trainer and every engine "
                               "(vLLM's PyNccl); without them use nccl (gloo on CPU), disk, delta or object_store")
        named, _ = self.weights_fn("cpu")
        self.layout = tensor_specs(named)
        return {"master_address": node_address(), "master_port": free_port(),
                "world_size": 1 + ctx.engines * ctx.tensor_parallel_size,
                "tensor_parallel_size": ctx.tensor_parallel_size, "layout": self.layout,
                "buffer_bytes": int(ctx.options["bucket_mb"] * 2**20), "num_buffers": NUM_BUFFERS}

    def connect(self, info):
        """Rank 0 of the group; returns once every engine worker joined (they connect at the same time)."""
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self.group = trainer_init(info, rank=0)
        self.info = info

    def send(self, version, engine_versions):
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        if self.group is None:
            raise RuntimeError("VLLMNcclSender.send before connect(): the weight-sync group is not set up")
        named, meta = self.weights_fn("cuda")
        check_against_layout(named, self.layout)
        packed_nccl_broadcast_producer(iterator=iter(named), group=self.group, src=0,
                                       post_iter_func=lambda item: item[1],
                                       buffer_size_bytes=self.info["buffer_bytes"],
                                       num_buffers=self.info["num_buffers"])
        torch.cuda.current_stream().synchronize()
        return None, meta

    def close(self) -> None:
        if self.group is not None:
            self.group.destroy()
            self.group = None


class VLLMNcclReceiver(VLLMEngineReceiver):
    """One engine worker: vLLM's `NCCLWeightTransferEngine` joins the group and receives; we load what it unpacks."""

    vllm_backend = "nccl"

    def __init__(self):
        super().__init__()
        self.update: dict = {}

    def connect(self, info, engine_index):
        """Joins the group as rank 1 + engine_index * t (+ this worker's tensor-parallel rank, added by vLLM)."""
        self.init_native({"master_address": info["master_address"], "master_port": info["master_port"],
                          "rank_offset": 1 + engine_index * info["tensor_parallel_size"],
                          "world_size": info["world_size"], "packed": True,
                          "packed_buffer_size_bytes": info["buffer_bytes"], "packed_num_buffers": info["num_buffers"]})
        self.update = {"names": [n for n, _, _ in info["layout"]],
                       "dtype_names": [str(d).split(".")[-1] for _, _, d in info["layout"]],
                       "shapes": [list(s) for _, s, _ in info["layout"]]}

    def update_info(self, payload) -> dict:
        if not self.update:
            raise RuntimeError("a broadcast before connect: this engine is not in the weight-sync group")
        return self.update


class VLLMNcclStrategy(WeightSyncStrategy):
    sender = VLLMNcclSender
    receiver = VLLMNcclReceiver
    concurrent = True  # receivers meet the sender on the wire: launched together, payload None

    def options(self, weight_sync_cfg) -> dict:
        return {"bucket_mb": weight_sync_cfg.bucket_mb}


STRATEGY = VLLMNcclStrategy()
