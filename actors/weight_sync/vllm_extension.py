"""vLLM worker extension that receives new policy weights and reports what the engine holds.

vLLM mixes this class into its worker (`worker_extension_cls`); `collective_rpc` calls its methods.
Weights load through the worker's `reload_weights(weights_iterator=...)`, which also redoes the
backend's weight post-processing (the CPU backend repacks linear weights; a plain
`model.load_weights` would leave stale packed copies in use).

Verification: checksums are read back from the engine's resident parameters. Where the backend has
moved a layer's weight into an opaque packed handle (vLLM's CPU oneDNN path leaves an empty
parameter behind), that tensor group is checksummed at the point of loading instead: the values the
model's weight loader consumed for this version. The integration tests also compare the engine's
logprobs with the trainer's after a sync, which covers the packed path end to end.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Optional

import torch

from actors.weight_sync import collective
from actors.weight_sync.receiver import broadcast_stream, disk_stream
from orchestrator.sync.checksum import add_checksum, checksum_group, group_checksums
from orchestrator.sync.delta import DeltaPayload, apply_delta


class WeightReceiverExtension:
    """Methods run inside each vLLM worker process (or in-process on CPU).

    Every load path ends in `_load`: it streams (name, tensor) pairs into `reload_weights`, records the
    group checksums of what was loaded, and sets the weight version only after the load completed. With
    the delta strategy the worker also keeps a host copy of the last loaded weights (`_shadow`, one
    weight set in the sync dtype) to apply the next XOR delta to.
    """

    weight_version: int = 0
    _loaded_checksums: dict = {}
    _shadow: Optional[dict] = None
    _keep_shadow: bool = False
    _digests: Optional[dict] = None
    _fault_next_load: bool = False
    _sync_group: Optional[tuple] = None  # (group name, layout, bucket_mb, device of the buckets)
    _shadow_version: Optional[int] = None

    # ---- load paths (one per strategy) ------------------------------------------------------
    def load_named_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Object store: HF-named tensors (fused names are handled by the model's own loader)."""
        self._load(named_tensors, version)

    def load_weights_from_disk(self, folder: str, version: int) -> None:
        """Disk: the safetensors shards of `version` in `folder` (see `DiskSender`)."""
        self._load(disk_stream(folder, version), version)

    def join_weight_group(self, backend: str, world_size: int, rank: int, group: str, timeout_s: float,
                          layout: list, bucket_mb: float) -> None:
        """Collective: join the trainer's group as `rank` + this worker's tensor-parallel rank (the syncer gives
        each engine t consecutive ranks) and remember the agreed layout."""
        rank += _tp_position()[0]  # tensor parallelism: the engine's base rank + this worker's TP rank
        collective.join_group(backend, world_size, rank, group, timeout_s)
        self._sync_group = (group, layout, bucket_mb, "cuda" if backend.lower() == "nccl" else "cpu")

    def receive_broadcast(self, version: int) -> None:
        """Collective: receive one bucketed broadcast and load it while it streams in."""
        if self._sync_group is None:
            raise RuntimeError("receive_broadcast before join_weight_group: this engine is not in the sync group")
        group, layout, bucket_mb, device = self._sync_group
        self._load(broadcast_stream(layout, bucket_mb, version, group, device), version)

    def load_delta(self, payload: DeltaPayload, version: int) -> None:
        """Delta: apply an XOR delta to the host copy of the last version, then load the result.
        Raises ValueError when this worker does not hold the delta's base version."""
        if self._shadow is None or self._shadow_version != payload.base_version:
            have = None if self._shadow is None else self._shadow_version
            raise ValueError(f"delta {payload.base_version}->{payload.version} needs base version "
                             f"{payload.base_version}; this engine holds {have}")
        self._load(list(apply_delta(self._shadow, payload).items()), version)

    def keep_shadow(self, on: bool) -> None:
        """Keep (or drop) the host copy of the last loaded weights that deltas apply to."""
        self._keep_shadow = on
        if not on:
            self._shadow = None

    def _load(self, stream: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        device = next(self.model_runner.get_model().parameters()).device
        checks: dict = {}
        shadow: Optional[dict] = {} if self._keep_shadow else None
        digests: Optional[dict] = {} if self._digests is not None else None

        def tap():
            for i, (name, t) in enumerate(stream):
                if self._fault_next_load and i == 0:
                    t = t.clone()
                    t.view(-1)[0] += 1.0  # fault injection (tests): one corrupted value in the first bucket
                add_checksum(checks, name, t)
                if shadow is not None:
                    shadow[name] = t.detach().to("cpu", copy=True)
                if digests is not None:
                    digests[name] = _digest(t)
                yield name, t.to(device)

        self.reload_weights(weights_iterator=tap())
        self._retie_output_embeddings()
        self._fault_next_load = False
        self._loaded_checksums, self.weight_version = checks, version
        if shadow is not None:
            self._shadow, self._shadow_version = shadow, version
        if digests is not None:
            self._digests = digests

    def _retie_output_embeddings(self) -> None:
        """vLLM's layerwise reload unties tied embeddings and puts the output head's old kernel back
        (its `Failed to load weights` warning): tie the head to the new embedding again and redo its
        post-processing (the CPU backend packs the head's weight for its GEMM)."""
        model = self.model_runner.get_model()
        if not getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False):
            return
        head = getattr(model, "lm_head", None)
        embeds = [m for m in model.modules() if type(m).__name__ == "VocabParallelEmbedding"]
        if head is None or len(embeds) != 1 or not hasattr(head, "weight"):
            return
        embed = embeds[0]
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)

    def weight_checksums(self) -> dict:
        """{"version", "groups": {group: [sum, sumsq, numel]}, "packed_groups": [...]}.

        Resident parameters are read back; groups with a parameter packed away by the backend
        (numel 0) report the checksums of the values loaded into them for this version, or are
        left out before the first sync (nothing was loaded through us yet). Under tensor parallelism
        (tp_size > 1) every parameter is a shard or a replica, so every group reports the checksums of the
        full tensors this worker's loader consumed (`verified_on: "load"`); the engine checks that all its
        workers agree (orchestrator.sync.checksum.combine_worker_reports).
        """
        tp_rank, tp_size = _tp_position()
        base = {"version": self.weight_version, "tp_rank": tp_rank,
                "shadow_version": self._shadow_version if self._shadow is not None else None}
        if tp_size > 1:  # every resident tensor is a shard: report the full tensors the loader consumed
            loaded = dict(self._loaded_checksums)
            return {**base, "groups": loaded, "packed_groups": sorted(loaded), "verified_on": "load"}
        # remove_duplicate=False: a tied output head is listed (and checked) under its own name too
        params = list(self.model_runner.get_model().named_parameters(remove_duplicate=False))
        packed = {checksum_group(n) for n, p in params if p.numel() == 0}
        groups = group_checksums((n, p) for n, p in params if checksum_group(n) not in packed)
        for g in packed:
            if g in self._loaded_checksums:
                groups[g] = self._loaded_checksums[g]
        return {**base, "groups": groups, "packed_groups": sorted(packed), "verified_on": "resident"}

    # ---- test and debugging hooks -------------------------------------------------------------
    def record_digests(self, on: bool = True) -> None:
        """Keep a SHA-256 of every tensor loaded from now on (bit-exactness checks; costs a hash pass)."""
        self._digests = {} if on else None

    def loaded_digests(self) -> dict:
        """{name: sha256 hex} of the tensors of the last load (after `record_digests`)."""
        return dict(self._digests or {})

    def inject_fault_next_load(self) -> None:
        """Corrupt one value of the next load (tests: verification must catch it)."""
        self._fault_next_load = True


def _tp_position() -> tuple[int, int]:
    """(tensor-parallel rank, tensor-parallel size) of this vLLM worker; (0, 1) outside a TP group."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())
    except (ImportError, AssertionError, AttributeError):
        return 0, 1


def _digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype and shape not included)."""
    x = t.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(x.view(torch.uint8).numpy().tobytes()).hexdigest()
