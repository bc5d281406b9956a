"""The `weight_sync` section of the run config (orchestrator/config/schema.py composes the sections): the strategy,
its verification, retries and probe, and each strategy's own options (docs/weight-sync.md, docs/configuration.md);
`check_weight_sync_section` resolves the strategy now."""
from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.fields import choice, number


@dataclass
class SyncFabricConfig:
    """What the cost model (`weight_sync.strategy: auto`, `rl-orch plan sync`) assumes about the cluster.
    Bandwidths in GB/s (10^9 bytes per second, one direction)."""
    intra_node: str = choice("loopback", ("nvlink", "pcie4", "pcie5", "loopback"))  # nvlink | pcie4 | pcie5 | loopback: trainer <-> engines on one node
    inter_node: str = choice("eth25", ("ib200", "ib400", "eth25", "eth100", "loopback"))  # ib200 | ib400 | eth25 | eth100 | loopback: across nodes
    engine_nodes: int = number(0, ge=0, finite=True)  # nodes that hold rollout engines apart from the trainer's node; 0 = same node
    fs_write_gbps: float = number(1.0, gt=0)  # the shared filesystem (weight_sync.disk.path): write rate from the trainer
    fs_read_gbps: float = number(2.0, gt=0)  # its aggregate read rate over all engines


@dataclass
class DiskSyncConfig:
    # Shared by the trainer and every engine (NFS, a PVC). Versions live in v<version>/, written under a
    # temporary name and renamed when complete; older versions are removed once every engine loaded.
    path: str = "${run.output_dir}/weight_sync"
    shard_mb: int = number(2048, gt=0)


@dataclass
class DeltaSyncConfig:
    # A full sync instead when more than this fraction of the elements changed since the engines' version.
    max_changed_fraction: float = number(0.5, gt=0, le=1)
    zstd_level: int = number(3, ge=1, le=22)
    full_every: int = number(0, ge=0, finite=True)  # also a full sync every N versions (0 = never forced)


@dataclass
class WeightSyncConfig:
    # a registered strategy (orchestrator/weight_sync/registry.py: nccl | disk | delta | object_store), "auto"
    # (the cheapest by the cost model), or the dotted path of a module defining STRATEGY (your own strategy)
    strategy: str = "object_store"
    bucket_mb: int = number(256, gt=0)  # nccl/gloo: parameters flattened into buckets of this size, double-buffered
    timeout_s: float = number(600.0, gt=0)  # one sync (all buckets, all engines); past it the run stops with an error
    verify: bool = True  # every engine reports its version and per-group checksums after each sync
    retries: int = number(1, ge=0, finite=True)  # a sync that fails verification is redone this many times (sync/failures counts them)
    # After a verified sync every engine scores a fixed token sequence and its logprobs must match the trainer's
    # (orchestrator/weight_sync/probe.py): checks the weights the engine computes with, not only those it loaded.
    probe: bool = True
    probe_every: int = number(1, ge=1, finite=True)  # probe every N-th sync (an engine's first sync always)
    # max |engine - trainer| logprob in nats over the probe's tokens; 0 = by rollout.dtype (float32 1e-3,
    # bfloat16/float16 4.0: ten times the differences measured, docs/weight-sync.md)
    probe_tolerance: float = number(0.0, ge=0, finite=True)
    # The full-distribution check: the KL of the engine's and the trainer's next-token distributions on the probe
    # text over the engine's top-k tokens and the rest (sync/probe_full_kl; a lower bound of the full KL); 0 = off.
    # At most vLLM's max_logprobs (20).
    probe_top_k: int = number(20, ge=0, le=20, finite=True, note="(0 = off)")
    probe_kl_tolerance: float = number(0.0, ge=0, finite=True)  # nats; 0 = by rollout.dtype (float32 1e-5, 16-bit 0.1)
    # Streaming runs (rollout.mode=stream): the engines load, are verified and probed while the next step trains;
    # the trainer waits only for its own send (orchestrator/weight_sync/overlapped.py). Each engine samples nothing
    # until it is verified. Ignored by a concurrent strategy (nccl), whose syncs hold the trainer on the wire.
    overlap: bool = True
    disk: DiskSyncConfig = field(default_factory=DiskSyncConfig)
    delta: DeltaSyncConfig = field(default_factory=DeltaSyncConfig)
    fabric: SyncFabricConfig = field(default_factory=SyncFabricConfig)


def check_weight_sync_section(cfg) -> None:
    """weight_sync.strategy: "auto", a registered strategy, or a dotted module path defining STRATEGY
    (orchestrator/weight_sync/registry.py) that fits the placement (`check_strategy_fits`).
    Raises ValueError naming the key; orchestrator/config/load.py
    `validate` calls it (as ConfigError)."""
    from orchestrator.weight_sync.registry import get

    if cfg.weight_sync.strategy != "auto":
        check_strategy_fits(get(cfg.weight_sync.strategy), cfg)


def check_strategy_fits(entry, cfg) -> None:
    """Raises ValueError naming the keys when strategy `entry` (a registry entry) does not work with this run's
    placement.mode or with its engines' GPU count (rollout.num_workers x rollout.tensor_parallel_size)."""
    mode = cfg.placement.mode
    if entry.placement_modes and mode not in entry.placement_modes:
        raise ValueError(f"weight_sync.strategy={entry.name} works with placement.mode in {list(entry.placement_modes)} "
                         f"(got placement.mode={mode}): vllm_ipc hands the engines handles to the trainer's GPU memory "
                         "(colocated only), vllm_nccl puts trainer and engines in one NCCL group, which refuses two "
                         "ranks on one GPU (not colocated); otherwise use nccl, disk, delta or object_store")
    r = cfg.rollout
    elastic = bool(getattr(cfg.placement, "elastic", False))
    engines, key = ((max(r.num_workers, getattr(r, "max_workers", 0)), "rollout.max_workers (placement.elastic)")
                    if elastic else (r.num_workers, "rollout.num_workers"))
    gpus = int(engines) * int(getattr(r, "tensor_parallel_size", 1) or 1)
    if entry.max_engine_gpus and gpus > entry.max_engine_gpus:
        raise ValueError(f"weight_sync.strategy={entry.name} serves at most {entry.max_engine_gpus} engine GPU(s) "
                         f"(the trainer's rank 0 shares one GPU's copy); {key} x "
                         f"rollout.tensor_parallel_size = {gpus}: use one engine with tensor_parallel_size 1, or "
                         "another strategy")
