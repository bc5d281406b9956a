"""Delta weight sync: XOR + zstd against each engine's last verified version; a full sync where that is
not possible (orchestrator/weight_sync/delta.py holds the pure encoding).

The sender keeps the last version it sent (the base) and encodes the next one against it. An engine
gets the delta when the controller verified it on the base version and the delta is worth sending;
otherwise (no base yet, `weight_sync.delta.full_every`, more than `max_changed_fraction` of the
elements changed, or an engine that missed a version) it gets the full tensors, which the sender puts
into the object store only when some engine of the sync needs them. Each engine keeps a host copy of
what it loaded last (its shadow, one weight set in the sync dtype) to apply the next delta to, and
reports that copy's version (`shadow_version`), which the controller checks after every sync.
"""
from __future__ import annotations

import time
from typing import Optional

import ray
import torch

from actors.weight_sync.base import WeightReceiver, WeightSender, WeightSyncStrategy
from actors.weight_sync.zero_copy import SharedTensors
from orchestrator.weight_sync.checksum import WeightMismatchError
from orchestrator.weight_sync.delta import DeltaPayload, apply_delta, encode_delta


class DeltaEncoder:
    """Keeps the last version sent and encodes the next one against it."""

    def __init__(self, weights_fn, level: int = 3):
        self.weights_fn, self.level = weights_fn, level
        self.base: Optional[dict[str, torch.Tensor]] = None
        self.base_version: Optional[int] = None

    def encode(self, version: int, max_changed_fraction: float, force_full: bool = False):
        """Returns (payload or None, stats). None: engines need a full sync (no base yet, forced, or
        more than `max_changed_fraction` of the elements changed). The new version becomes the base."""
        named, meta = self.weights_fn("cpu")
        new = {n: t.clone() for n, t in named}  # never alias live parameters: the optimizer moves them
        payload: Optional[DeltaPayload] = None
        stats = {**meta, "base_version": self.base_version, "full_reason": None, "encode_s": 0.0}
        if self.base is None or force_full:
            stats["full_reason"] = "no base version" if self.base is None else "forced full sync"
        else:
            t0 = time.perf_counter()
            payload = encode_delta(self.base, new, self.base_version, version, self.level)
            stats.update(encode_s=time.perf_counter() - t0, changed_fraction=payload.changed_fraction,
                         delta_bytes=payload.nbytes)
            if payload.changed_fraction > max_changed_fraction:
                stats["full_reason"] = f"changed fraction {payload.changed_fraction:.3f} > {max_changed_fraction}"
                payload = None
        self.base, self.base_version = new, version
        return payload, stats


class DeltaSender(WeightSender):
    """Payload {"delta": DeltaPayload or None, "delta_engines": [engine index], "full": ObjectRef of the
    full named tensors or None}; meta = the encoder's stats + "delta_engines"."""

    def setup(self, ctx):
        super().setup(ctx)
        self.encoder = DeltaEncoder(self.weights_fn, ctx.options["zstd_level"])
        return {}

    def send(self, version, engine_versions):
        o = self.ctx.options
        force = bool(o["full_every"]) and version % o["full_every"] == 0
        payload, stats = self.encoder.encode(version, o["max_changed_fraction"], force)
        base = stats["base_version"]
        delta_engines = [i for i, v in engine_versions.items() if stats["full_reason"] is None and v == base]
        full = None
        if len(delta_engines) < len(engine_versions):  # same tensors (and order) as weights_for_sync's
            full = ray.put(SharedTensors(self.encoder.base.items()))
        return ({"delta": payload if delta_engines else None, "delta_engines": delta_engines, "full": full},
                {**stats, "delta_engines": delta_engines})


class DeltaReceiver(WeightReceiver):
    """Applies the delta to its shadow copy, or loads the full tensors; records the new shadow."""

    def __init__(self):
        self.engine_index: Optional[int] = None
        self.shadow: Optional[dict] = None
        self.shadow_version: Optional[int] = None
        self._pending: Optional[dict] = None

    def connect(self, info, engine_index):
        self.engine_index = engine_index

    def stream(self, payload, version):
        """Raises ValueError when this engine should apply a delta but does not hold its base version."""
        self._pending = {}
        if self.engine_index not in payload["delta_engines"]:
            return ray.get(payload["full"])
        delta: DeltaPayload = payload["delta"]
        if self.shadow is None or self.shadow_version != delta.base_version:
            have = None if self.shadow is None else self.shadow_version
            raise ValueError(f"delta {delta.base_version}->{delta.version} needs base version "
                             f"{delta.base_version}; this engine holds {have}")
        return list(apply_delta(self.shadow, delta).items())

    def loaded_tensor(self, name, tensor):
        self._pending[name] = tensor.detach().to("cpu", copy=True)

    def loaded(self, version):
        self.shadow, self.shadow_version, self._pending = self._pending, version, None

    def report(self):
        return {"shadow_version": self.shadow_version if self.shadow is not None else None}


class DeltaStrategy(WeightSyncStrategy):
    sender = DeltaSender
    receiver = DeltaReceiver

    def options(self, weight_sync_cfg) -> dict:
        d = weight_sync_cfg.delta
        return {"zstd_level": int(d.zstd_level), "max_changed_fraction": float(d.max_changed_fraction),
                "full_every": int(d.full_every)}

    def check_reports(self, version, reports):
        for i, rep in reports.items():
            if rep.get("shadow_version") != version:
                raise WeightMismatchError(f"rollout worker {i}: its delta base is version {rep.get('shadow_version')} "
                                          f"after syncing version {version}")

    def metrics(self, meta, reports):
        n, n_delta = len(reports), len(meta["delta_engines"])
        moved = (n_delta * meta.get("delta_bytes", 0) + (n - n_delta) * meta["bytes"]) / max(n, 1)
        out = {"sync/bytes": moved, "sync/delta_engines": n_delta, "sync/encode_s": meta["encode_s"]}
        if "changed_fraction" in meta:
            out["sync/changed_fraction"] = meta["changed_fraction"]
            out["sync/delta_ratio"] = meta["delta_bytes"] / max(meta["bytes"], 1)
        return out


STRATEGY = DeltaStrategy()
