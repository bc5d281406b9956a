"""vLLM's own CUDA IPC weight transfer (strategy "vllm_ipc"): colocated engines read the trainer's GPU tensors in place.

The trainer shares each tensor of the version through a CUDA IPC handle (`torch.multiprocessing.reductions.
reduce_tensor`, keyed by the GPU's UUID, as vLLM's `IPCTrainerWeightTransferEngine` builds them); the payload every
engine gets is those handles with the names, dtypes and shapes (a few KB through Ray, or into an AsyncLLM core).
The engine side is vLLM's `IPCWeightTransferEngine`, built through vLLM's factory by our transfer engine
(actors/weight_sync/transfer_engine.py), which rebuilds each tensor on the engine's GPU and hands it to our
checksumming loader: no copy through host memory. Our verification stays on top (version, checksums, probe).

Only for engines on the trainer's GPUs (placement.mode=colocated; a handle opens only on the GPU that made it), and
only with CUDA. Memory: the sender keeps one copy of the weights in the engines' dtype on its GPU from the send until
every engine was verified (the trainer may train meanwhile in a streaming run, so its parameters are not shared
themselves), then frees it.
"""
from __future__ import annotations

import torch

from actors.weight_sync.base import WeightSender, WeightSyncStrategy
from actors.weight_sync.vllm_native import VLLMEngineReceiver


class VLLMIpcSender(WeightSender):
    """Shares a copy of each version through CUDA IPC handles; the copy lives until the engines were verified."""

    def __init__(self, weights_fn):
        super().__init__(weights_fn)
        self.held: dict[int, list[torch.Tensor]] = {}  # version -> the shared copies (alive until verified)

    def setup(self, ctx):
        """Raises VLLMAPIError when an API it uses changed, RuntimeError without CUDA on the trainer."""
        super().setup(ctx)
        from actors.rollout.vllm_compat import IPC, check_vllm_api

        check_vllm_api(also=IPC)  # the vLLM APIs this strategy uses, named if changed
        if not torch.cuda.is_available():
            raise RuntimeError("weight_sync.strategy=vllm_ipc needs CUDA GPUs shared by the trainer and the engines "
                               "(placement.mode=colocated); otherwise use nccl, disk, delta or object_store")
        return {}

    def send(self, version, engine_versions):
        """payload: {"names", "dtype_names", "shapes", "ipc_handles": [{gpu uuid: rebuild args}, ...]}."""
        from torch.multiprocessing.reductions import reduce_tensor

        named, meta = self.weights_fn("cuda")
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        copies = [t.detach().clone(memory_format=torch.contiguous_format) for _, t in named]
        torch.cuda.current_stream().synchronize()  # the copies are complete before any engine opens them
        self.held[version] = copies
        payload = {"names": [n for n, _ in named], "dtype_names": [str(t.dtype).split(".")[-1] for _, t in named],
                   "shapes": [list(t.shape) for _, t in named],
                   "ipc_handles": [{uuid: reduce_tensor(c)[1]} for c in copies]}
        return payload, meta

    def after_verified(self, version: int) -> None:
        """Free every copy up to `version` (every engine holds it now)."""
        for v in [v for v in self.held if v <= version]:
            del self.held[v]
        torch.cuda.ipc_collect()

    def close(self) -> None:
        self.held.clear()


class VLLMIpcReceiver(VLLMEngineReceiver):
    """vLLM's `IPCWeightTransferEngine` opens the handles on this engine's GPU; we load what it rebuilt."""

    vllm_backend = "ipc"

    def connect(self, info, engine_index):
        self.init_native({"packed": False})

    def update_info(self, payload) -> dict:
        return payload  # the sender's handles, names, dtypes and shapes


class VLLMIpcStrategy(WeightSyncStrategy):
    sender = VLLMIpcSender
    receiver = VLLMIpcReceiver


STRATEGY = VLLMIpcStrategy()

