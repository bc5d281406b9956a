"""What the strategies that run one of vLLM's own weight-transfer engines share (vllm_nccl.py, vllm_ipc.py): the
receiver that hands its transfer to vLLM's engine and loads what that engine unpacks through our checks."""
from __future__ import annotations

from typing import Any, Callable, Optional

from actors.weight_sync.base import WeightReceiver


class ChunkLoader:
    """The model vLLM's engine is given: `load_weights(chunk)` hands each unpacked chunk to `load`, set per update
    (our transfer engine's checksumming loader into the real model)."""

    def __init__(self):
        self.load: Optional[Callable[[Any], Any]] = None

    def load_weights(self, weights):
        if self.load is None:
            raise RuntimeError("weight sync: a chunk from vLLM's transfer engine arrived outside an update")
        return self.load(weights)


class VLLMEngineReceiver(WeightReceiver):
    """A receiver whose transfer is vLLM's engine `vllm_backend`, made at `attach`. Subclasses give `connect` (the
    engine's init info) and `update_info(payload)` (its per-update info)."""

    vllm_backend = ""

    def __init__(self):
        self.loader = ChunkLoader()
        self.native = None  # vLLM's engine, made by `attach`

    def attach(self, make_vllm_engine) -> None:
        self.native = make_vllm_engine(self.vllm_backend, self.loader)

    def init_native(self, init_info: dict) -> None:
        """vLLM's `init_transfer_engine` with `init_info`; RuntimeError before `attach`."""
        if self.native is None:
            raise RuntimeError(f"weight sync (vLLM's {self.vllm_backend} engine): connect before attach (the engine "
                               "has no vLLM transfer engine)")
        self.native.init_transfer_engine(self.native.parse_init_info(init_info))

    def update_info(self, payload) -> dict:
        raise NotImplementedError

    def receive(self, payload, version, load) -> None:
        info = self.update_info(payload)
        self.loader.load = load
        try:
            self.native.receive_weights(self.native.parse_update_info(info))
        finally:
            self.loader.load = None

    def close(self) -> None:
        if self.native is not None:
            self.native.shutdown()
