"""Checksums that prove a rollout engine holds exactly the trainer's weights after a weight sync.

The trainer names parameters as HF does (`...self_attn.q_proj.weight`); a vLLM engine fuses some of
them (`...self_attn.qkv_proj.weight`, `...mlp.gate_up_proj.weight`) and may repack their layout. So
checksums are taken per *tensor group*, the module path without its last module
(`model.layers.3.self_attn`), and are invariant to concatenation and layout: the float64 sum, the sum
of squares and the element count of every tensor in the group. A stale engine, a lost bucket or a
corrupted value changes them; summation order changes them by ~1e-12 relative at most.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch


class WeightMismatchError(RuntimeError):
    """An engine's weights differ from the trainer's; the message names the tensor group."""


class NonFiniteWeightsError(RuntimeError):
    """The trainer's own weights hold NaN or inf (its checksums are not finite): no engine could match them and
    a retry cannot help; the message names the first such tensor group. Not a WeightMismatchError."""


def check_finite_checksums(groups: dict[str, list[float]], where: str = "the trainer") -> None:
    """Raise NonFiniteWeightsError naming the first tensor group (in the order of the weights) whose float64
    sum or sum of squares is NaN or inf. Float64 sums of finite fp32/bf16 values never overflow (at most
    ~1e77 per element squared), so a non-finite checksum means a non-finite weight."""
    for group, (total, squares, *_) in groups.items():
        if not (math.isfinite(total) and math.isfinite(squares)):
            raise NonFiniteWeightsError(
                f"{where}'s weights are not finite: tensor group {group!r} has sum {total!r}, sum of squares "
                f"{squares!r} (the first such group in the model's order). The trainer skips updates that would make "
                "them so (actors/trainer/finite.py), so they came from elsewhere: a checkpoint holding NaN or inf, or "
                "an update path that bypasses the guard. Resume from an earlier checkpoint (checkpoint.resume=<path>)")


def checksum_group(name: str) -> str:
    """'model.layers.3.self_attn.q_proj.weight' -> 'model.layers.3.self_attn'; 'lm_head.weight' -> 'lm_head'."""
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else parts[0]


def group_checksums(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[float]]:
    """{group: [sum, sum of squares, numel]} over the tensors' values in float64. A tensor listed twice
    (the same memory, dtype, shape and strides: a tied lm_head beside the embedding) is summed once and
    counted under both names."""
    out: dict[str, list[float]] = {}
    seen: dict[tuple, tuple[float, float]] = {}
    for name, t in named_tensors:
        flat = t.detach().reshape(-1)
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen[key] = _sums_f64(flat)
        acc = out.setdefault(checksum_group(name), [0.0, 0.0, 0.0])
        acc[0] += seen[key][0]
        acc[1] += seen[key][1]
        acc[2] += float(flat.numel())
    return out


# Elements converted to float64 at a time (8 MiB): a whole-tensor float64 copy plus an `x * x` temporary
# (3x the fp32 bytes, fresh pages every call) made the checksums ~2x slower (benchmarks/RESULTS.md, issue 7).
_CHUNK = 1 << 20


def add_checksum(out: dict[str, list[float]], name: str, t: torch.Tensor) -> None:
    """Add one tensor to running group checksums `out` (for tensors that stream past once): float64 sum
    and sum of squares (accumulated over float64 chunks of `_CHUNK` elements) and the element count."""
    flat = t.detach().reshape(-1)
    s, ss = _sums_f64(flat)
    acc = out.setdefault(checksum_group(name), [0.0, 0.0, 0.0])
    acc[0] += s
    acc[1] += ss
    acc[2] += float(flat.numel())


def _sums_f64(flat: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of squares) of a 1-D tensor of any real dtype, in float64, on its own device."""
    n = flat.numel()
    if n <= _CHUNK:
        x = flat.to(torch.float64)
        return float(x.sum()), float(torch.dot(x, x))
    buf = torch.empty(_CHUNK, dtype=torch.float64, device=flat.device)
    s = torch.zeros((), dtype=torch.float64, device=flat.device)
    ss = torch.zeros((), dtype=torch.float64, device=flat.device)
    for i in range(0, n, _CHUNK):
        b = buf[: min(_CHUNK, n - i)]
        b.copy_(flat[i : i + _CHUNK])
        s += b.sum()
        ss += torch.dot(b, b)
    return float(s), float(ss)


def compare_checksums(expected: dict[str, list[float]], actual: dict[str, list[float]], *,
                      where: str = "engine", rel_tol: float = 1e-9) -> None:
    """Raise WeightMismatchError naming the first tensor group that is missing or differs (a non-finite value on
    the engine's side is named as such). Check the trainer's own checksums first (`check_finite_checksums`:
    the syncer does), or its NaN reads as a mismatch here."""
    for group, exp in sorted(expected.items()):
        got = actual.get(group)
        if got is None:
            raise WeightMismatchError(f"{where}: tensor group {group!r} is missing after the weight sync")
        for label, e, g in zip(("sum", "sum of squares", "element count"), exp, got):
            if not math.isclose(e, g, rel_tol=rel_tol, abs_tol=1e-6):
                what = "holds non-finite weights (NaN or inf)" if not math.isfinite(g) else "differs from the trainer's"
                raise WeightMismatchError(
                    f"{where}: tensor group {group!r} {what} after the weight sync "
                    f"({label}: trainer {e!r}, engine {g!r}); refusing to roll out on stale or corrupted weights")


def combine_worker_reports(reports: list[dict]) -> dict:
    """One engine's checksum report from its vLLM workers' reports (`collective_rpc("weight_checksums")`).

    One worker (tensor_parallel_size 1): its report. Several (tensor parallelism): each worker holds only
    shards of the weights, so each reports the checksums of the full tensors its weight loader consumed
    (`WeightReceiverExtension.weight_checksums`); they must all hold the same version and the same
    checksums, and the engine reports worker 0's with `tp_workers` set.

    Raises ValueError for an empty list; WeightMismatchError naming the worker whose version or tensor
    group differs from worker 0's.
    """
    if not reports:
        raise ValueError("worker reports: the engine returned no worker report")
    first = reports[0]
    if len(reports) == 1:
        return first
    for k, rep in enumerate(reports[1:], start=1):
        if rep["version"] != first["version"]:
            raise WeightMismatchError(f"tensor-parallel worker {k} of this engine holds weight version "
                                      f"{rep['version']}, worker 0 holds {first['version']}")
        compare_checksums(first["groups"], rep["groups"], where=f"tensor-parallel worker {k} of this engine")
        compare_checksums(rep["groups"], first["groups"], where=f"tensor-parallel worker 0 of this engine "
                                                                f"(against worker {k})")
    return {**first, "tp_workers": len(reports)}
