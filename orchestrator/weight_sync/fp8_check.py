"""Verifying what an FP8 engine holds after a weight sync (pure torch; the engine side is
actors/weight_sync/fp8_resident.py).

An FP8 engine (rollout.quantization=fp8) receives the trainer's 16/32-bit weights and quantises every linear
layer per tensor when it loads them: scale = amax(|W|) / 448 (float32), W8 = fp8_e4m3(W / scale). Its resident
FP8 weights cannot equal the trainer's checksums, so the verification has two halves:

1. the stream: the checksums of the high-precision tensors the engine's loader consumed equal the trainer's
   (`verified_on: "load"` groups, as for weights a backend packs away, orchestrator/weight_sync/checksum.py);
2. the quantisation: at the point of loading, the engine re-quantises each layer's high-precision weight (as its
   loader assembled it: fused q/k/v, gate/up, its tensor-parallel shard) with vLLM's own quantisation kernel and
   the scale above, and requires the layer's processed FP8 weight and scale to equal that bit for bit; it keeps an
   exact fingerprint of both, and every checksum report fingerprints the resident tensors again, so a later
   change of a resident FP8 weight is caught too.

    scale = fp8_scale(w)                           # float32 [1]
    q = quantize_fp8(w, scale)                     # float8_e4m3fn, w's shape (the CPU reference)
    rec = expect_layer(resident_w, resident_scale, q, scale)   # {"layout", "weight", "scale"} or {"error"}
    err = resident_error(rec, resident_w, resident_scale)      # None when they still match
    check_fp8_report(report, where="rollout worker 0")         # raises WeightMismatchError
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from orchestrator.weight_sync.checksum import WeightMismatchError

FP8_E4M3_MAX = 448.0
_CHUNK = 1 << 24  # bytes fingerprinted at a time (an int64 copy of 16 Mi elements: 128 MiB)
_WEIGHT_PERIOD = 8191  # position weights 1..8191: a permutation or a moved byte changes the fingerprint


def fp8_scale(w: torch.Tensor, fp8_max: float = FP8_E4M3_MAX,
              reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """Per-tensor scale of `w` (any float dtype, any shape): float32 [1], amax(|w|) / fp8_max (as vLLM's online
    FP8 computes it: the amax in w's dtype, then a float32 true division). `reduce`: applied to the amax [1]
    first (the engine's max over the tensor-parallel shards of a sharded weight)."""
    lo, hi = w.aminmax()
    amax = torch.maximum(lo.abs(), hi.abs()).reshape(1)
    if reduce is not None:
        amax = reduce(amax)
    return amax.to(torch.float32) / torch.tensor(fp8_max, dtype=torch.float32, device=w.device)


def quantize_fp8(w: torch.Tensor, scale: torch.Tensor, fp8_max: float = FP8_E4M3_MAX,
                 dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """Reference static per-tensor quantisation: fp8(clamp(float32(w) * (1 / scale), +-fp8_max)), rounded to
    nearest even (as vLLM's static FP8 kernel multiplies by the reciprocal). Returns `dtype`, w's shape."""
    inv = 1.0 / scale.to(torch.float32)
    return (w.to(torch.float32) * inv).clamp_(-fp8_max, fp8_max).to(dtype)


def fingerprint(t: torch.Tensor) -> list[int]:
    """Exact fingerprint of a tensor's bytes in its logical (row-major) order: [bytes, sum of bytes, sum of
    byte * position weight]. Equal tensors give equal fingerprints; one changed byte changes the sum."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    total = weighted = 0
    for i in range(0, b.numel(), _CHUNK):
        x = b[i : i + _CHUNK].to(torch.int64)
        pos = torch.arange(i, i + x.numel(), device=x.device, dtype=torch.int64) % _WEIGHT_PERIOD + 1
        total += int(x.sum())
        weighted += int((x * pos).sum())
    return [int(b.numel()), total, weighted]


def _oriented(resident: torch.Tensor, layout: str) -> torch.Tensor:
    return resident.t() if layout == "t" else resident


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def expect_layer(resident_w: torch.Tensor, resident_scale: torch.Tensor, q: torch.Tensor,
                 scale: torch.Tensor) -> dict:
    """Compare a layer's processed FP8 weight and scale with the re-quantisation (q [out, in], scale [1]).
    vLLM keeps per-tensor FP8 weights transposed ([in, out], layout "t") for its GEMMs; both orientations are
    accepted. Returns {"layout", "weight": fingerprint, "scale": fingerprint} on a match, else {"error": what}."""
    if resident_scale.numel() != 1 or not _same_bits(resident_scale.reshape(1).float(), scale.reshape(1).float()):
        return {"error": f"scale {resident_scale.reshape(-1)[:2].tolist()} != re-quantisation's "
                         f"{scale.reshape(-1).tolist()}"}
    for layout in ("t", "n"):
        if _same_bits(_oriented(resident_w, layout), q):
            return {"layout": layout, "weight": fingerprint(q), "scale": fingerprint(scale.reshape(1).float())}
    return {"error": f"FP8 weight ({tuple(resident_w.shape)}, {resident_w.dtype}) differs from the re-quantisation "
                     f"of the loaded weights ({tuple(q.shape)}, {q.dtype})"}


def resident_error(record: dict, resident_w: torch.Tensor, resident_scale: torch.Tensor) -> Optional[str]:
    """None when the resident weight and scale still have the fingerprints recorded at loading; else what
    differs (the error recorded at loading, if any)."""
    if "error" in record:
        return record["error"]
    if fingerprint(_oriented(resident_w, record["layout"])) != record["weight"]:
        return "resident FP8 weight changed after the verified load"
    if fingerprint(resident_scale.reshape(1).float()) != record["scale"]:
        return "resident FP8 scale changed after the verified load"
    return None


def check_fp8_report(report: dict, where: str) -> None:
    """Raise WeightMismatchError when an engine's report has FP8 layers that differ ("fp8": {"layers": n,
    "errors": {layer: what}}), naming the first; no-op for reports without "fp8" (16/32-bit engines)."""
    fp8 = report.get("fp8")
    if not fp8:
        return
    if fp8.get("layers", 0) == 0:
        raise WeightMismatchError(f"{where}: FP8 engine reports no FP8 layer verified after the weight sync")
    errors = fp8.get("errors") or {}
    if errors:
        layer = sorted(errors)[0]
        raise WeightMismatchError(f"{where}: FP8 layer {layer!r}: {errors[layer]} ({len(errors)} of {fp8['layers']} "
                                  "FP8 layers differ); refusing to roll out on them")


def merge_fp8(reports: list[dict]) -> Optional[dict]:
    """One engine's "fp8" entry from its tensor-parallel workers' reports (each holds its own shards): the
    layers summed, the errors of every worker (prefixed by its rank). None when no worker reports FP8."""
    parts = [(k, r["fp8"]) for k, r in enumerate(reports) if r.get("fp8")]
    if not parts:
        return None
    errors = {f"{name} (tp worker {k})": e for k, part in parts for name, e in (part.get("errors") or {}).items()}
    return {"layers": sum(p.get("layers", 0) for _, p in parts), "errors": errors}

