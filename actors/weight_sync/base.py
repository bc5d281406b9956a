"""The weight-sync seam: a sender (trainer side), a receiver (engine side) and a strategy description.

A strategy is one module in actors/weight_sync/ holding all three, plus one line in
orchestrator/weight_sync/registry.py. The controller's generic syncer (orchestrator/weight_sync/syncer.py)
drives every strategy the same way and verifies, retries and times out for all of them:

    setup:  info = sender.setup(ctx)                           trainer (rank 0), once per syncer
            sender.connect(info) | receiver.connect(info, k)    concurrently, every engine k
    sync:   payload, meta = sender.send(version, engine_versions)           trainer, num_returns=2
            receiver.receive(payload, version, load)                   every engine: by default load(receiver.stream(...))
            verification of every engine's version and checksums against meta["groups"]
            sender.after_verified(version)                      once every engine holds `version`

The payload reaches every engine as a top-level ObjectRef argument (Ray resolves it before the call);
a strategy with `concurrent = True` (the collective broadcast) has its receivers launched together with
the sender and gets payload None. Senders run on the trainer actor (`Trainer.weight_sync`); receivers
run inside vLLM's worker, in our weight-transfer engine (actors/weight_sync/transfer_engine.py, which vLLM's
`init_weight_transfer_engine` / `start_weight_update` / `update_weights` / `finish_weight_update` drive): it feeds
their streams to vLLM's layerwise reload, checksums what was loaded and sets the weight version.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

# weights_fn(device) -> (named tensors [(HF name, tensor in the engines' dtype)], {"groups": checksums, "bytes"})
WeightsFn = Callable[[str], tuple[list[tuple[str, torch.Tensor]], dict]]


@dataclass
class SyncContext:
    """What a sender's `setup` gets. `engines`: engine count; `tensor_parallel_size`: workers per engine;
    `timeout_s`: weight_sync.timeout_s; `dtype`: the engines' dtype name ("bfloat16", ...); `options`: the
    strategy's own settings (`WeightSyncStrategy.options`, e.g. {"path", "shard_mb"} for disk)."""

    engines: int
    tensor_parallel_size: int
    timeout_s: float
    dtype: str
    options: dict = field(default_factory=dict)


class WeightSender:
    """Trainer side of one strategy; one instance per syncer, kept by the trainer between syncs."""

    def __init__(self, weights_fn: WeightsFn):
        self.weights_fn = weights_fn
        self.ctx: Optional[SyncContext] = None

    def setup(self, ctx: SyncContext) -> dict:
        """Once, before the first sync; returns the `info` every receiver's `connect` gets (picklable)."""
        self.ctx = ctx
        return {}

    def connect(self, info: dict) -> None:
        """Runs concurrently with every receiver's `connect` (e.g. a collective group join)."""

    def send(self, version: int, engine_versions: dict[int, Optional[int]]) -> tuple[Any, dict]:
        """Send `version` (call with num_returns=2). `engine_versions`: {engine index: the version the
        controller last verified on it, None if never} for the engines of this sync. Returns (payload
        for every receiver's `stream`, meta {"groups": expected checksums, "bytes": full set, ...})."""
        raise NotImplementedError

    def after_verified(self, version: int) -> None:
        """Clean-up once every engine was verified on `version`. Not called unless a subclass overrides it."""

    def close(self) -> None:
        """Release what `connect` made (a group) before a new syncer's sender replaces this one."""


class WeightReceiver:
    """Engine side of one strategy; one instance per vLLM worker, made on the first `connect`."""

    def connect(self, info: dict, engine_index: int) -> None:
        """Once per syncer: `info` from the sender's `setup`; `engine_index`: this engine's position (0..E-1)."""

    def attach(self, make_vllm_engine: Callable[[str, Any], Any]) -> None:
        """Before `connect`, in the engine: `make_vllm_engine(backend, model)` builds one of vLLM's own
        weight-transfer engines ("nccl", "ipc", ...) over this worker, whose received chunks go to
        `model.load_weights` (a receiver that delegates its transfer to vLLM: actors/weight_sync/vllm_nccl.py)."""

    def stream(self, payload: Any, version: int) -> Iterable[tuple[str, torch.Tensor]]:
        """(HF name, tensor) pairs of `version`, any device; the engine loads them as they come."""
        raise NotImplementedError

    def receive(self, payload: Any, version: int, load: Callable[[Iterable[tuple[str, torch.Tensor]]], Any]) -> None:
        """Push form of `stream`: hand `load` the pairs of `version`, in one or more calls (default: all of
        `stream`). A receiver whose transfer pushes chunks (vLLM's engines) overrides this instead of `stream`."""
        load(self.stream(payload, version))

    def loaded_tensor(self, name: str, tensor: torch.Tensor) -> None:
        """Every tensor as the engine loads it (after the extension's test fault injection)."""

    def loaded(self, version: int) -> None:
        """The engine finished loading `version` (vLLM's post-processing done)."""

    def report(self) -> dict:
        """Extra fields of the engine's checksum report (e.g. {"shadow_version"} for deltas)."""
        return {}

    def close(self) -> None:
        """Release what `connect` made (a group); the engine's transfer engine shuts down or a syncer reconnects."""


class WeightSyncStrategy:
    """A strategy's description: its two classes and the controller-side hooks (all optional). Its name is
    its registry line's (orchestrator/weight_sync/registry.py); the module exposes it as `STRATEGY`.

    concurrent: receivers are launched with the sender and get payload None (their `stream` meets the
    sender on the wire); then every sync must reach every engine.
    """

    sender: type[WeightSender] = WeightSender
    receiver: type[WeightReceiver] = WeightReceiver
    concurrent: bool = False

    def options(self, weight_sync_cfg) -> dict:
        """SyncContext.options from the `weight_sync` config section (plain values only)."""
        return {}

    def check_reports(self, version: int, reports: dict[int, dict]) -> None:
        """Strategy-specific checks of the engines' reports before the shared verification; raises
        orchestrator.weight_sync.WeightMismatchError naming the engine."""

    def metrics(self, meta: dict, reports: dict[int, dict]) -> dict:
        """`sync/*` metrics of one sync beyond the shared ones; "sync/bytes" here overrides meta["bytes"]
        as the bytes moved per engine."""
        return {}



def tp_position() -> tuple[int, int]:
    """(tensor-parallel rank, tensor-parallel size) of this vLLM worker; (0, 1) outside a TP group."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())
    except (ImportError, AssertionError, AttributeError):
        return 0, 1
