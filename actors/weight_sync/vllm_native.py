"""What the strategies that run one of vLLM's own weight-transfer engines share (vllm_nccl.py, vllm_ipc.py): the
receiver that hands its transfer to vLLM's engine and loads what that engine unpacks through our checks."""
from __future__ import annotations

from typing import Any, Callable, Optional

from actors.weight_sync.base import WeightReceiver


class ChunkLoader:
    """The model vLLM's engine is given: `load_weights(chunk)` hands each unpacked chunk to `load`, set per update
    (our transfer engine's checksumming loader into the real model). A chunk whose load raises is kept in `error`
    and the chunks after it are dropped, not loaded: vLLM's engine goes on receiving them, so a broadcast group's
    other members (the trainer, the other engines) finish theirs instead of waiting on this one until
    weight_sync.timeout_s; the receiver raises `error` once the transfer is over (`VLLMEngineReceiver.receive`)."""

    def __init__(self):
        self.load: Optional[Callable[[Any], Any]] = None
        self.error: Optional[BaseException] = None
        self.dropped = 0  # chunks received and dropped after a failed load, this update

    def load_weights(self, weights):
        if self.load is None:
            raise RuntimeError("weight sync: a chunk from vLLM's transfer engine arrived outside an update")
        if self.error is not None:
            self.dropped += 1
            return None
        try:
            return self.load(weights)
        except Exception as e:  # noqa: BLE001 - kept and raised after the transfer (the class docstring)
            self.error = e
            return None


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
        """vLLM's engine receives the update and hands each chunk to `load`. Raises the first chunk's load error (its
        own type, with a note of the chunks dropped after it) once the whole transfer was received (`ChunkLoader`)."""
        info = self.update_info(payload)
        self.loader.load, self.loader.error, self.loader.dropped = load, None, 0
        try:
            self.native.receive_weights(self.native.parse_update_info(info))
        finally:
            self.loader.load = None
        if self.loader.error is not None:
            error, self.loader.error = self.loader.error, None
            error.add_note(f"weight sync (vLLM's {self.vllm_backend} engine): the rest of the transfer was received "
                           f"and dropped ({self.loader.dropped} chunks after the one that failed)")
            raise error

    def close(self) -> None:
        if self.native is not None:
            self.native.shutdown()
