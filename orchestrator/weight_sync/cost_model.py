"""Weight-sync cost model: predicted seconds for each way trainer weights reach the rollout engines.

Pure (no Ray, vLLM or torch). One `predict_<strategy>(setup) -> SyncEstimate` per strategy; the strategy
registry (orchestrator/weight_sync/registry.py) names each strategy's predictor, and its `predict_sync` /
`choose_strategy` (what `weight_sync.strategy: auto` and `rl-orch plan sync` call) go through it:

    setup = setup_from_fabric(70e9, 2, num_engines=8, gpus_per_engine=8, engine_nodes=8, inter="ib400")
    predict_nccl(setup).seconds; orchestrator.weight_sync.predict_sync(setup)["nccl"].seconds

Units: bytes, seconds, and GB/s = 1e9 bytes per second in one direction. Every strategy is a sum of
phases that run one after another (encode -> transfer -> decode -> load); each formula sits in the
docstring of its `predict_*` function and in `SyncEstimate.notes`. Not modelled: the trainer-side
gather of sharded (FSDP) parameters, which comes before every strategy, and engines pausing generation.

Notation used in the formulas: B = num_params * bytes_per_param (one full weight set), R = number of
receiving ranks = num_engines * gpus_per_engine (each rank of a tensor-parallel engine receives the full
set and keeps its own shard, as the vLLM `load_weights` path does), N = engine_nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from orchestrator.utils.finite import nonnegative_problem

# GB/s (1e9 B/s), one direction, per GPU or per rank. Line rates (upper bounds) unless stated otherwise.
FABRICS: dict[str, float] = {
    # NVIDIA H100 SXM5 datasheet: NVLink 4, 18 links, 900 GB/s bidirectional per GPU -> 450 one way.
    "nvlink": 450.0,
    # PCIe 4.0 x16: 16 GT/s * 16 lanes * 128/130 / 8 = 31.5 GB/s raw; ~25 measured with pinned cudaMemcpy.
    "pcie4": 25.0,
    # PCIe 5.0 x16: 63 GB/s raw; ~50 measured.
    "pcie5": 50.0,
    # InfiniBand HDR 200 Gb/s and NDR 400 Gb/s (ConnectX-6/-7), one NIC per GPU: line rate / 8.
    "ib200": 25.0,
    "ib400": 50.0,
    # Ethernet 25 and 100 Gb/s line rate / 8.
    "eth25": 3.125,
    "eth100": 12.5,
    # Assumed: gloo over TCP between processes on one CPU host. The benchmark overrides it with a measurement.
    "loopback": 5.0,
}

# NCCL's Simple protocol moves a broadcast through the ring in steps of NCCL_BUFFSIZE / NCCL_STEPS
# = 4 MiB / 8 = 512 KiB (NCCL environment-variable documentation, defaults); each extra hop of the ring
# delays the last receiver by one step.
NCCL_STEP_BYTES: int = 512 * 1024


class SyncSetupError(ValueError):
    """A `SyncSetup` field is out of range; `.field` holds the field's name."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class SyncSetup:
    """The model, the engines' layout and the rates the cost model uses. Rates in GB/s (1e9 B/s).

    num_params: parameters in one full weight set (an integral float such as 70e9 is accepted).
    bytes_per_param: 2 for bf16/fp16, 4 for fp32.
    num_engines, gpus_per_engine: rollout engines and the tensor-parallel size of each.
    engine_nodes: nodes holding engines apart from the trainer's node; 0 = engines on the trainer's node.
        When > 0 every engine is on another node, spread evenly (at most one node per engine GPU).
    intra_gbps / inter_gbps: link rate inside a node / across nodes (see FABRICS).
    fs_write_gbps: shared-filesystem write rate from the trainer; fs_read_gbps: its aggregate read rate
        over all readers together.
    memcpy_gbps: host copy rate (device->host copy).
    store_gbps: rate of one put into, or one fetch out of, Ray's shared-memory object store on a node,
        serialisation included (well below memcpy for many tensors; the benchmark measures it).
    pack_gbps: rate of copying tensors into a flat bucket (GPU: device copy, hundreds of GB/s; CPU/gloo:
        host memcpy, set it to memcpy_gbps).
    load_gbps: rate at which one engine loads a full weight set into its model; engines load in parallel.
    bucket_mb: NCCL/gloo bucket size in MiB (1 MiB = 2**20 B), as `weight_sync.bucket_mb`.
    op_latency_s: fixed cost of one collective op or one object put/fetch.
    changed_fraction: fraction of elements changed since the engines' version (delta only).
    encode_gbps: XOR + zstd encode rate on the trainer, over the full bytes B.
    decode_gbps: decode + apply rate on one engine rank, over the full bytes B; ranks in parallel.
    compressed_bytes_per_changed: compressed delta bytes per changed element; None = 1.1 * bytes_per_param
        (the XOR'd value plus its share of run-length/position overhead; zstd shrinks the zero runs to
        almost nothing).
    max_changed_fraction: above it delta falls back to sending the full set (`weight_sync.delta.
        max_changed_fraction`).

    Raises SyncSetupError (a ValueError) naming the first field out of range.
    """

    num_params: int
    bytes_per_param: float = 2.0
    num_engines: int = 1
    gpus_per_engine: int = 1
    engine_nodes: int = 0
    intra_gbps: float = FABRICS["nvlink"]
    inter_gbps: float = FABRICS["ib400"]
    fs_write_gbps: float = 5.0
    fs_read_gbps: float = 20.0
    memcpy_gbps: float = 10.0
    store_gbps: float = 5.0
    pack_gbps: float = 500.0
    load_gbps: float = 100.0
    bucket_mb: float = 256.0
    op_latency_s: float = 1e-3
    changed_fraction: float = 1.0
    encode_gbps: float = 10.0
    decode_gbps: float = 20.0
    compressed_bytes_per_changed: float | None = None
    max_changed_fraction: float = 0.5

    def __post_init__(self) -> None:
        for name in ("num_params", "num_engines", "gpus_per_engine", "engine_nodes"):
            object.__setattr__(self, name, _as_int(name, getattr(self, name)))
        if self.compressed_bytes_per_changed is None:
            object.__setattr__(self, "compressed_bytes_per_changed", 1.1 * _as_float(
                "bytes_per_param", self.bytes_per_param))
        _check(self.num_params >= 1, "num_params", f"must be >= 1 (got {self.num_params})")
        _check(self.num_engines >= 1, "num_engines", f"must be >= 1 (got {self.num_engines})")
        _check(self.gpus_per_engine >= 1, "gpus_per_engine", f"must be >= 1 (got {self.gpus_per_engine})")
        _check(0 <= self.engine_nodes <= self.receivers, "engine_nodes",
               f"must be in [0, num_engines * gpus_per_engine = {self.receivers}] (got {self.engine_nodes})")
        for name in _POSITIVE_FIELDS:
            value = _as_float(name, getattr(self, name))
            _check(value > 0, name, f"must be > 0 (got {value})")
        if (why := nonnegative_problem(self.op_latency_s)) is not None:
            raise SyncSetupError("op_latency_s", why)
        for name in ("changed_fraction", "max_changed_fraction"):
            value = _as_float(name, getattr(self, name))
            _check(0.0 <= value <= 1.0, name, f"must be in [0, 1] (got {value})")

    @property
    def weight_bytes(self) -> float:
        """B: bytes of one full weight set."""
        return self.num_params * self.bytes_per_param

    @property
    def receivers(self) -> int:
        """R: ranks that each receive the full set (num_engines * gpus_per_engine)."""
        return self.num_engines * self.gpus_per_engine


@dataclass
class SyncEstimate:
    """One strategy's predicted cost. seconds = encode_s + transfer_s + decode_s + load_s.

    bytes_moved: bytes that cross a link (network, bus or filesystem), summed over receivers where each
    receiver gets its own copy. notes: the formula used, with the rates filled in.
    """

    strategy: str
    seconds: float
    bytes_moved: float
    transfer_s: float
    load_s: float
    encode_s: float = 0.0
    decode_s: float = 0.0
    notes: str = field(default="")


_POSITIVE_FIELDS = ("bytes_per_param", "intra_gbps", "inter_gbps", "fs_write_gbps", "fs_read_gbps",
                    "memcpy_gbps", "store_gbps", "pack_gbps", "load_gbps", "bucket_mb", "encode_gbps", "decode_gbps",
                    "compressed_bytes_per_changed")


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise SyncSetupError(name, f"must be an integer (got {value!r})")
    return int(value)


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SyncSetupError(name, f"must be a finite number (got {value!r})")
    return float(value)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise SyncSetupError(name, message)


def _gb(value: float) -> float:
    return value * 1e9


def _load_s(s: SyncSetup) -> float:
    """load = B / load_gbps: every engine loads the full set into its model, engines in parallel."""
    return s.weight_bytes / _gb(s.load_gbps)


def predict_nccl(s: SyncSetup) -> SyncEstimate:
    """Bucketed, double-buffered pipelined ring broadcast from one trainer rank (NCCL; gloo on CPU).

    transfer = max(B / pack, B / link) + bucket / pack + n_buckets * (op_latency + R * step / link)
    load = B / load_gbps

    A pipelined ring broadcast moves the full bytes once over every link of the ring, so its time is
    B over the slowest link, independent of the receiver count R (NCCL broadcast uses the ring
    algorithm); link = intra if N == 0 else min(intra, inter), one rail (a single root stream).
    Packing bucket k+1 overlaps sending bucket k, hence the max(); the first bucket's pack is exposed.
    Each bucket is one collective op: op_latency plus the ring's fill, R hops of one NCCL step (512 KiB).
    bytes_moved = R * B.
    """
    b = s.weight_bytes
    link = s.intra_gbps if s.engine_nodes == 0 else min(s.intra_gbps, s.inter_gbps)
    bucket = min(s.bucket_mb * 2**20, b)
    n_buckets = math.ceil(b / bucket)
    fill_s = s.receivers * min(NCCL_STEP_BYTES, bucket) / _gb(link)
    transfer = max(b / _gb(s.pack_gbps), b / _gb(link)) + bucket / _gb(s.pack_gbps) \
        + n_buckets * (s.op_latency_s + fill_s)
    load = _load_s(s)
    notes = (f"max(B/pack, B/link) + bucket/pack + n_buckets*(lat + R*512KiB/link) + B/load; "
             f"link={link:g} GB/s, n_buckets={n_buckets}, R={s.receivers}")
    return SyncEstimate("nccl", transfer + load, s.receivers * b, transfer, load, notes=notes)


def predict_disk(s: SyncSetup) -> SyncEstimate:
    """Safetensors shards on a shared filesystem, then every engine rank reads the full set.

    transfer = B / fs_write + R * B / fs_read;  load = B / load_gbps

    The trainer writes once; all R ranks read the whole set at the same time and share the aggregate
    read rate fs_read (assumed: the filesystem, not the nodes' links, is the limit; no page-cache sharing
    between ranks of one node, which is the conservative case). bytes_moved = B + R * B.
    """
    b = s.weight_bytes
    write_s = b / _gb(s.fs_write_gbps)
    read_s = s.receivers * b / _gb(s.fs_read_gbps)
    load = _load_s(s)
    notes = (f"B/fs_write + R*B/fs_read + B/load; write={write_s:.3g}s, read={read_s:.3g}s, "
             f"R={s.receivers}")
    return SyncEstimate("disk", write_s + read_s + load, b + s.receivers * b, write_s + read_s, load,
                        notes=notes)


def _object_store_transfer(s: SyncSetup, payload: float) -> tuple[float, float]:
    """(seconds, bytes_moved) to carry `payload` bytes from the trainer to every rank via Ray's store.

    seconds = 2 * op_latency + payload / store + N * payload / inter + payload / store
    put: one copy into the trainer node's shared-memory store. Across nodes: assumed every engine node
    pulls its copy from the owner node (Ray's object manager fetches from a node holding the object; we
    do not count on copies spreading node to node), so the owner's outbound link carries N copies one
    after another. On each node the copy is read out of shared memory by every rank in parallel.
    bytes_moved = payload (put) + N * payload (across nodes) + R * payload (local reads).
    """
    put_s = payload / _gb(s.store_gbps)
    across_s = s.engine_nodes * payload / _gb(s.inter_gbps)
    read_s = payload / _gb(s.store_gbps)
    moved = payload * (1 + s.engine_nodes + s.receivers)
    return 2 * s.op_latency_s + put_s + across_s + read_s, moved


def predict_object_store(s: SyncSetup) -> SyncEstimate:
    """The whole set of named tensors put once into the Ray object store; each engine fetches it.

    transfer = 2 * op_latency + B / store + N * B / inter + B / store;  load = B / load_gbps
    (see `_object_store_transfer` for the assumption about Ray's object transfer).
    """
    b = s.weight_bytes
    transfer, moved = _object_store_transfer(s, b)
    load = _load_s(s)
    notes = (f"2*lat + B/store (put) + N*B/inter (owner-node pulls) + B/store (local read) + B/load; "
             f"N={s.engine_nodes}")
    return SyncEstimate("object_store", transfer + load, moved, transfer, load, notes=notes)


def predict_delta(s: SyncSetup) -> SyncEstimate:
    """Changed elements only: XOR of bf16 bit patterns against the engines' version, zstd, object store.

    encode = B / encode_gbps (the XOR pass runs over the full set, also when it ends in a fallback)
    payload = f * num_params * compressed_bytes_per_changed   if f <= max_changed_fraction
            = B (full set, no decode)                           otherwise
    transfer = object-store transfer of payload (see `_object_store_transfer`)
    decode = B / decode_gbps (decompress and XOR into the engine's copy; ranks in parallel), 0 on fallback
    load = B / load_gbps
    """
    b = s.weight_bytes
    f = s.changed_fraction
    fallback = f > s.max_changed_fraction
    payload = b if fallback else f * s.num_params * s.compressed_bytes_per_changed
    encode = b / _gb(s.encode_gbps)
    transfer, moved = _object_store_transfer(s, payload)
    decode = 0.0 if fallback else b / _gb(s.decode_gbps)
    load = _load_s(s)
    what = "full set (fallback)" if fallback else "f*P*c"
    notes = (f"B/encode + object_store(payload) + B/decode + B/load; payload={what}="
             f"{payload / 1e9:.3g} GB, f={f:g}, fallback above {s.max_changed_fraction:g}")
    return SyncEstimate("delta", encode + transfer + decode + load, moved, transfer, load,
                        encode_s=encode, decode_s=decode, notes=notes)


def fabric_gbps(name: str, argument: str = "fabric") -> float:
    """FABRICS[name]; ValueError naming `argument` and the allowed names when unknown."""
    if name not in FABRICS:
        raise ValueError(f"{argument}: unknown fabric {name!r}; allowed: {', '.join(FABRICS)}")
    return FABRICS[name]


def setup_from_fabric(num_params: float, bytes_per_param: float, num_engines: int, gpus_per_engine: int,
                      engine_nodes: int, intra: str = "nvlink", inter: str = "ib400",
                      fs_write_gbps: float = 5.0, fs_read_gbps: float = 20.0, **overrides) -> SyncSetup:
    """A SyncSetup whose link rates come from FABRICS by name; `overrides` set any other field.

    intra == "loopback" (processes on one CPU host, gloo) also packs at memcpy_gbps unless pack_gbps is
    given. Raises ValueError naming `intra`/`inter` for an unknown fabric, the field for an unknown
    override, and SyncSetupError for a value out of range.
    """
    known = {f.name for f in fields(SyncSetup)}
    for key in overrides:
        if key not in known:
            raise ValueError(f"{key}: not a SyncSetup field; allowed: {', '.join(sorted(known))}")
    kwargs = dict(num_params=num_params, bytes_per_param=bytes_per_param, num_engines=num_engines,
                  gpus_per_engine=gpus_per_engine, engine_nodes=engine_nodes,
                  intra_gbps=fabric_gbps(intra, "intra"), inter_gbps=fabric_gbps(inter, "inter"),
                  fs_write_gbps=fs_write_gbps, fs_read_gbps=fs_read_gbps)
    if intra == "loopback" and "pack_gbps" not in overrides:
        kwargs["pack_gbps"] = overrides.get("memcpy_gbps", SyncSetup.memcpy_gbps)
    kwargs.update(overrides)
    return SyncSetup(**kwargs)
