"""Our weight-sync strategies as one vLLM weight-transfer engine (vLLM's native protocol, `vllm.distributed.weight_transfer`).

vLLM's worker owns the weight-update lifecycle and calls its configured `WeightTransferEngine`; the engine is chosen
by `weight_transfer_config={"backend": BACKEND}` (vllm_engine.engine_kwargs) and registered here with vLLM's
`WeightTransferEngineFactory` when vLLM imports our worker extension (actors/weight_sync/vllm_extension.py), in
whichever process builds the worker (this actor's, or an AsyncLLM core's). The rollout engine drives the protocol
through `collective_rpc`, the same calls vLLM's `AsyncLLM` and HTTP routes make:

    init_weight_transfer_engine({"strategy", "info", "engine_index"})   once per syncer: the strategy's receiver connects
    start_weight_update()                                              vLLM's layerwise reload begins
    update_weights({"strategy", "payload", "version"})                 the receiver's stream, loaded as it comes
    finish_weight_update()                                             reload finalized (backend repacking), version set
    shutdown_weight_transfer_engine()                                  receivers closed (a syncer can connect again)

One engine serves every strategy (each strategy's receiver is made at its `init`), so a run can change strategy, and
a strategy of a user's module (registry entry) needs no vLLM registration of its own. What the engine records per
load (the group checksums of the values loaded, the version, the FP8 re-quantisation) is what the extension's
`weight_checksums` reports for verification (orchestrator/weight_sync/checksum.py).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from actors.weight_sync.base import WeightReceiver
from actors.weight_sync.fp8_resident import FP8Verifier, online_fp8_layers
from actors.weight_sync.resident_faults import corrupt_resident_weights
from orchestrator.weight_sync.checksum import add_checksum
from orchestrator.weight_sync.registry import entry_of

BACKEND = "rl_orch"  # WeightTransferConfig.backend of our engines
NO_VERSION = -1  # the version an engine reports after a failed load: it holds no verified version


@dataclass
class StrategyInitInfo(WeightTransferInitInfo):
    """`init_weight_transfer_engine`'s info: `strategy` (a registry entry or a registered name), `info` (the sender's
    `setup` result) and `engine_index` (this engine's position, 0..E-1)."""

    strategy: Any
    info: dict = field(default_factory=dict)
    engine_index: int = 0


@dataclass
class StrategyUpdateInfo(WeightTransferUpdateInfo):
    """`update_weights`' info: `strategy`, the sender's `payload` for this engine (None for a concurrent strategy,
    whose receiver meets the sender on the wire) and the policy `version` being loaded."""

    strategy: Any
    payload: Any = None
    version: int = 0


@dataclass
class LoadFaults:
    """Test hooks of the next load: `corrupt_first` (one value of the first tensor +1), `hang_s` (the load blocks
    this long first), `scale_after` (after the load, one layer computes with its weight times this)."""

    corrupt_first: bool = False
    hang_s: float = 0.0
    scale_after: float = 0.0


@dataclass
class _Update:
    version: Optional[int] = None
    receiver: Optional[WeightReceiver] = None
    checks: dict = field(default_factory=dict)
    digests: Optional[dict] = None
    failed: bool = False


class StrategyTransferEngine(WeightTransferEngine[StrategyInitInfo, StrategyUpdateInfo]):
    """vLLM's engine contract over our receivers (actors/weight_sync/<strategy>.py).

    Public state, read by the worker extension: `version` (the last version finished; NO_VERSION after a failed
    load), `loaded_checksums`
    ({group: [sum, sumsq, numel]} of the values the last load consumed), `receivers` ({strategy name: receiver}),
    `fp8` (FP8Verifier of an online-FP8 engine, else None), `digests` (per-tensor SHA-256 of the last load when
    recording, else None) and `faults` (LoadFaults, tests). Errors: `update_weights` outside a start/finish pair is
    refused by vLLM's worker (RuntimeError); a receiver's own errors (a torn file, a timed-out group) propagate."""

    init_info_cls = StrategyInitInfo
    update_info_cls = StrategyUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receivers: dict[str, WeightReceiver] = {}
        self.version = 0
        self.loaded_checksums: dict = {}
        self.digests: Optional[dict] = None
        self.fp8: Optional[FP8Verifier] = None
        self.faults = LoadFaults()
        self.finish_error: Optional[BaseException] = None
        self._update: Optional[_Update] = None

    def init_transfer_engine(self, init_info: StrategyInitInfo) -> None:
        """A fresh receiver of `init_info.strategy`, connected (a collective group joins here)."""
        entry = entry_of(init_info.strategy)
        old = self.receivers.pop(entry.name, None)
        if old is not None:
            old.close()
        receiver = entry.load().receiver()
        receiver.attach(self.vllm_engine)
        receiver.connect(init_info.info, init_info.engine_index)
        self.receivers[entry.name] = receiver

    def vllm_engine(self, backend: str, model) -> WeightTransferEngine:
        """One of vLLM's own weight-transfer engines (`backend`: "nccl", "ipc", ...) over this worker, loading into
        `model` (a receiver's chunk loader; actors/weight_sync/vllm_nccl.py). ValueError names the registered ones."""
        return WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=backend), self.vllm_config,
                                                         self.device, model)

    def start_weight_update(self) -> None:
        """Begin a load: vLLM's layerwise reload (which redoes the backend's weight post-processing at finish)."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if self.faults.hang_s:  # an engine that stops answering mid-sync (weight_sync.timeout_s must catch it)
            time.sleep(self.faults.hang_s)
            self.faults.hang_s = 0.0
        if self.fp8 is None and online_fp8_layers(self.model):
            self.fp8 = FP8Verifier()
            self.fp8.install(self.model)
        if self.fp8 is not None:
            self.fp8.begin()
        self._update = _Update(digests={} if self.digests is not None else None)
        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's `update_weights`, with the device synchronised only where there is an accelerator (CPU: none).
        When the stream fails (its error is raised), the reload is finalized here, because vLLM's worker ends the
        update without calling `finish_weight_update`: layers not reached get their previous weights back instead of
        staying on the meta device, and the version and checksums stay the previous ones."""
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            self.finish_weight_update()
            self.finish_error = None  # the stream's own error is the one raised
            raise
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: StrategyUpdateInfo) -> None:
        """Load the receiver's (name, tensor) stream of `update_info.version` into the model as it comes."""
        if self._update is None:
            raise RuntimeError("weight transfer: update_weights before start_weight_update")
        entry = entry_of(update_info.strategy)
        if entry.name not in self.receivers:  # strategies whose receivers need no connect (disk, object_store)
            self.receivers[entry.name] = entry.load().receiver()
            self.receivers[entry.name].attach(self.vllm_engine)
        receiver, update = self.receivers[entry.name], self._update
        update.failed, update.version = True, None  # until the whole stream is loaded: a torn update commits nothing
        receiver.receive(update_info.payload, update_info.version,
                         lambda pairs: self.model.load_weights(self._tap(pairs, receiver)))
        update.version, update.receiver, update.failed = int(update_info.version), receiver, False

    def _tap(self, stream: Iterable[tuple[str, torch.Tensor]], receiver: WeightReceiver):
        update = self._update
        for name, t in stream:
            if self.faults.corrupt_first and not update.checks:
                t = t.clone()
                t.view(-1)[0] += 1.0  # one corrupted value in the first tensor (verification must catch it)
            add_checksum(update.checks, name, t)
            receiver.loaded_tensor(name, t)
            if update.digests is not None:
                update.digests[name] = digest(t)
            yield name, t.to(self.device)

    def finish_weight_update(self) -> None:
        """Finalize the reload (vLLM repacks and post-processes the new weights), re-tie a tied head, then record
        the version and the checksums of what was loaded. A start with no update keeps the previous ones.

        After a failed update the model holds a mix (layers reached have new weights; a layer cut off mid-stream is
        processed with what it got), so the version becomes NO_VERSION and the checksums are dropped: the syncer
        finds the engine on no verified version and sends it full weights. This never raises into vLLM's worker
        (which would otherwise stay inside the update for good): an error here is kept in `finish_error`, the version
        becomes NO_VERSION, and `take_finish_error` hands it to the caller (the extension's `transfer_weights`)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        update, self._update = self._update, None
        try:
            finalize_layerwise_reload(self.model, self.model_config)
            retie_output_embeddings(self.model, self.model_config)
            if update is None or update.version is None:
                if update is not None and update.failed:
                    self.version, self.loaded_checksums = NO_VERSION, {}
                return
            if self.faults.scale_after:  # the stream was right, the resident kernel is not (the probe must catch it)
                corrupt_resident_weights(self.model, self.faults.scale_after)
            self.faults = LoadFaults()
            self.loaded_checksums, self.version = update.checks, update.version
            update.receiver.loaded(update.version)
            if update.digests is not None:
                self.digests = update.digests
        except BaseException as e:  # noqa: BLE001 - kept for the caller; vLLM's worker must leave the update
            self.version, self.loaded_checksums, self.finish_error = NO_VERSION, {}, e

    def take_finish_error(self) -> Optional[BaseException]:
        """The error the last `finish_weight_update` kept (None if it completed), cleared."""
        error, self.finish_error = self.finish_error, None
        return error

    def shutdown(self) -> None:
        """Close and drop every receiver (a syncer connects again with `init_weight_transfer_engine`); the first
        error of a close is raised after all were closed."""
        receivers, self.receivers, errors = list(self.receivers.values()), {}, []
        for receiver in receivers:
            try:
                receiver.close()
            except Exception as e:  # noqa: BLE001 - raised below, once every receiver was closed
                errors.append(e)
        if errors:
            raise errors[0]


def retie_output_embeddings(model: torch.nn.Module, model_config) -> None:
    """vLLM's layerwise reload unties tied embeddings and puts the output head's old kernel back (its `Failed to load
    weights` warning): tie the head to the new embedding again and redo its post-processing (the CPU backend packs
    the head's weight for its GEMM). Nothing for a model without tied embeddings."""
    if not getattr(model_config.hf_config, "tie_word_embeddings", False):
        return
    head = getattr(model, "lm_head", None)
    embeds = [m for m in model.modules() if type(m).__name__ == "VocabParallelEmbedding"]
    if head is None or len(embeds) != 1 or not hasattr(head, "weight"):
        return
    head.weight = embeds[0].weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


def digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype and shape not included)."""
    x = t.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(x.view(torch.uint8).numpy().tobytes()).hexdigest()


def register() -> None:
    """Register `StrategyTransferEngine` as vLLM backend BACKEND (idempotent: a second import in one process)."""
    try:
        WeightTransferEngineFactory.register_engine(BACKEND, StrategyTransferEngine)
    except ValueError:  # already registered in this process
        pass


register()
