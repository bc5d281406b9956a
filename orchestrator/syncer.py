"""Controller side of weight sync: one class per strategy drives the trainer and every rollout engine,
then verifies what each engine holds.

    syncer = make_syncer(cfg, trainer, engines)   # weight_sync.strategy: nccl | disk | delta | object_store
    metrics = syncer.sync(version)                # raises WeightMismatchError / TimeoutError, never hangs

Verification (every strategy): each engine reports its weight version and per-group checksums; a wrong
version or a differing group raises `WeightMismatchError` naming the engine and the tensor group, so no
rollout runs on stale or corrupted weights. Every call waits at most `weight_sync.timeout_s`.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Optional

import ray

from orchestrator.sync import WeightMismatchError, choose_strategy, compare_checksums, predict_sync, setup_from_fabric


log = logging.getLogger(__name__)


class WeightSyncer:
    """Base: timing, verification and metrics; subclasses implement `_transfer`."""

    name = "base"

    def __init__(self, cfg, trainer, engines: list):
        self.cfg, self.ws = cfg, cfg.weight_sync
        self.trainer, self.engines = trainer, list(engines)
        self.dtype = cfg.rollout.dtype
        self.engine_versions: list[Optional[int]] = [None] * len(self.engines)

    def _get(self, refs, what: str):
        try:
            return ray.get(refs, timeout=self.ws.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"weight sync ({self.name}): {what} did not finish within "
                               f"weight_sync.timeout_s={self.ws.timeout_s:g}s") from None

    def setup(self) -> None:
        """One-time preparation before the first sync (group creation, engine options)."""

    def sync(self, version: int, engine_ids: Optional[list[int]] = None) -> dict:
        """Bring engines `engine_ids` (default: all) to `version`; returns `sync/*` metrics."""
        ids = list(range(len(self.engines))) if engine_ids is None else list(engine_ids)
        t0 = time.perf_counter()
        meta, reports, metrics = self._transfer(version, ids)
        self._verify(version, meta, dict(zip(ids, reports)))
        self._after_verified(version)
        seconds = time.perf_counter() - t0
        moved = metrics.get("sync/bytes", meta["bytes"])
        metrics.update({"sync/seconds": seconds, "sync/version": version, "sync/bytes_full": meta["bytes"],
                        "sync/bytes": moved, "sync/gbps": moved * len(ids) / max(seconds, 1e-9) / 1e9})
        return metrics

    def sync_with_retries(self, version: int, retries: int) -> dict:
        """`sync(version)`, redone up to `retries` times (weight_sync.retries) when verification fails: a
        corrupted or stale engine (WeightMismatchError). Returns the metrics of the attempt that passed, with
        `sync/failures` = the failed attempts before it (Prometheus rl_orch_sync_failures_total). Raises the
        last WeightMismatchError when every attempt failed; TimeoutError and other errors at once (a hung
        transport is not retried)."""
        for attempt in range(retries + 1):
            try:
                metrics = self.sync(version)
            except WeightMismatchError as e:
                if attempt == retries:
                    raise
                log.warning("weight sync to version %d failed verification (%s); redoing it (%d of %d)",
                            version, e, attempt + 1, retries)
                continue
            metrics["sync/failures"] = attempt
            return metrics
        raise AssertionError("unreachable")

    def _transfer(self, version: int, ids: list[int]) -> tuple[dict, list[dict], dict]:
        raise NotImplementedError

    def _after_verified(self, version: int) -> None:
        """Clean-up once the engines were verified (nothing by default)."""

    def _verify(self, version: int, meta: dict, reports: dict[int, dict]) -> None:
        for i, rep in reports.items():
            if rep["version"] != version:
                raise WeightMismatchError(f"rollout worker {i} reports weight version {rep['version']}, expected {version}")
            if self.ws.verify:
                compare_checksums(meta["groups"], rep["groups"], where=f"rollout worker {i}")
            self.engine_versions[i] = version


class ObjectStoreSync(WeightSyncer):
    """The named tensors go into the Ray object store once; every engine reads them from there."""

    name = "object_store"

    def _transfer(self, version, ids):
        named_ref, meta_ref = self.trainer.weights_for_sync.options(num_returns=2).remote(self.dtype)
        meta = self._get(meta_ref, "the trainer's weights")
        reports = self._get([self.engines[i].load_weights.remote(named_ref, version) for i in ids], "engine loads")
        return meta, reports, {}


class DiskSync(WeightSyncer):
    """Safetensors shards on a shared path; older versions removed once every engine loaded the new one."""

    name = "disk"

    def _transfer(self, version, ids):
        root = self.ws.disk.path
        meta = self._get(self.trainer.sync_disk_write.remote(root, version, self.ws.disk.shard_mb, self.dtype),
                         "the trainer's write")
        reports = self._get([self.engines[i].load_weights_from_disk.remote(meta["folder"], version) for i in ids],
                            "engine reads")
        return meta, reports, {"sync/write_s": meta["write_s"]}

    def _after_verified(self, version: int) -> None:
        """Older versions are removed once every engine was verified on this one."""
        if all(v == version for v in self.engine_versions):
            self._get(self.trainer.sync_disk_prune.remote(self.ws.disk.path, version), "pruning old versions")


class CollectiveSync(WeightSyncer):
    """Bucketed broadcast from trainer rank 0 over a ray.util.collective group (NCCL on GPUs, gloo on CPU)."""

    name = "nccl"

    def setup(self) -> None:
        group = f"rl_orch_sync_{uuid.uuid4().hex[:8]}"
        tp = int(getattr(self.cfg.rollout, "tensor_parallel_size", 1) or 1)
        world = 1 + len(self.engines) * tp  # trainer rank 0; engine k's TP workers are 1 + k*tp ... (k+1)*tp
        timeout = self.ws.timeout_s
        layout = self._get(self.trainer.sync_collective_layout.remote(self.dtype, self.ws.bucket_mb), "the layout")
        backend = self._get(self.trainer.sync_collective_backend.remote(), "the backend")
        refs = [self.trainer.sync_collective_join.remote(world, group, timeout)]
        refs += [e.join_weight_group.remote(backend, world, 1 + k * tp, group, timeout, layout, self.ws.bucket_mb)
                 for k, e in enumerate(self.engines)]
        self._get(refs, f"joining the {backend} group {group} ({world} ranks)")
        self.group, self.backend = group, backend

    def _transfer(self, version, ids):
        if len(ids) != len(self.engines):
            raise ValueError("a broadcast reaches every engine of the group; engine_ids must be all engines")
        send = self.trainer.sync_broadcast.remote(version)
        recv = [self.engines[i].receive_broadcast.remote(version) for i in ids]
        meta, *reports = self._get([send, *recv], f"the {self.backend} broadcast")
        return meta, reports, {"sync/buckets": meta["buckets"], "sync/wire_s": meta["wire_s"]}


class DeltaSync(WeightSyncer):
    """XOR + zstd against each engine's acknowledged version; a full sync where that is not possible."""

    name = "delta"

    def setup(self) -> None:
        self._get([e.extension_call.remote("keep_shadow", True) for e in self.engines], "enabling the host copy")

    def _transfer(self, version, ids):
        d = self.ws.delta
        force = bool(d.full_every) and version % d.full_every == 0
        payload_ref, stats_ref = self.trainer.sync_delta_encode.options(num_returns=2).remote(
            version, self.dtype, d.zstd_level, d.max_changed_fraction, force)
        stats = self._get(stats_ref, "the trainer's delta encoding")
        base = stats["base_version"]
        use_delta = {i: stats["full_reason"] is None and self.engine_versions[i] == base for i in ids}
        full_ref = None
        if not all(use_delta.values()):
            full_ref, _ = self.trainer.weights_for_sync.options(num_returns=2).remote(self.dtype)
        refs = [self.engines[i].load_delta.remote(payload_ref, version) if use_delta[i]
                else self.engines[i].load_weights.remote(full_ref, version) for i in ids]
        reports = self._get(refs, "engine loads")
        for i, rep in zip(ids, reports):
            if rep.get("shadow_version") != version:
                raise WeightMismatchError(f"rollout worker {i}: its delta base is version {rep.get('shadow_version')} "
                                          f"after syncing version {version}")
        n_delta = sum(use_delta.values())
        moved = (n_delta * stats.get("delta_bytes", 0) + (len(ids) - n_delta) * stats["bytes"]) / max(len(ids), 1)
        metrics = {"sync/bytes": moved, "sync/delta_engines": n_delta, "sync/encode_s": stats["encode_s"]}
        if "changed_fraction" in stats:
            metrics["sync/changed_fraction"] = stats["changed_fraction"]
            metrics["sync/delta_ratio"] = stats["delta_bytes"] / max(stats["bytes"], 1)
        return stats, reports, metrics


# Prior changed fraction for `auto` before any delta was measured: every fp32 element moves after an
# Adam step; 16-bit weights mostly keep their bits at RL learning rates (benchmarks/RESULTS.md measures it).
_PRIOR_CHANGED_FRACTION = {"float32": 1.0, "bfloat16": 0.25, "float16": 0.25}


def choose_for_config(cfg, num_params: int, nbytes: int) -> tuple[str, str]:
    """`weight_sync.strategy: auto`: the cheapest strategy predicted by the cost model for this run's
    model size, engine count and `weight_sync.fabric`; returns (strategy, the prediction table)."""
    f, ws = cfg.weight_sync.fabric, cfg.weight_sync
    setup = setup_from_fabric(num_params, nbytes / max(num_params, 1), cfg.rollout.num_workers, 1, f.engine_nodes,
                              intra=f.intra_node, inter=f.inter_node, fs_write_gbps=f.fs_write_gbps,
                              fs_read_gbps=f.fs_read_gbps, bucket_mb=ws.bucket_mb,
                              changed_fraction=_PRIOR_CHANGED_FRACTION[cfg.rollout.dtype],
                              max_changed_fraction=ws.delta.max_changed_fraction)
    estimates = predict_sync(setup)
    table = "\n".join(f"  {k:<13} {e.seconds:9.3f} s predicted" for k, e in estimates.items())
    return choose_strategy(setup), table


STRATEGIES = {"object_store": ObjectStoreSync, "disk": DiskSync, "nccl": CollectiveSync, "delta": DeltaSync}


def make_syncer(cfg, trainer, engines: list, strategy: Optional[str] = None) -> WeightSyncer:
    """The syncer for `strategy` (default `weight_sync.strategy`; `auto` must be resolved first)."""
    name = strategy or cfg.weight_sync.strategy
    if name not in STRATEGIES:
        raise ValueError(f"weight_sync.strategy={name!r}: choose one of {sorted(STRATEGIES)} (or auto)")
    syncer = STRATEGIES[name](cfg, trainer, engines)
    syncer.setup()
    return syncer
