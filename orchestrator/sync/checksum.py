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


def checksum_group(name: str) -> str:
    """'model.layers.3.self_attn.q_proj.weight' -> 'model.layers.3.self_attn'; 'lm_head.weight' -> 'lm_head'."""
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else parts[0]


def group_checksums(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[float]]:
    """{group: [sum, sum of squares, numel]} over the tensors' values in float64."""
    out: dict[str, list[float]] = {}
    for name, t in named_tensors:
        add_checksum(out, name, t)
    return out


def add_checksum(out: dict[str, list[float]], name: str, t: torch.Tensor) -> None:
    """Add one tensor to running group checksums `out` (for tensors that stream past once)."""
    x = t.detach().to(torch.float64)
    acc = out.setdefault(checksum_group(name), [0.0, 0.0, 0.0])
    acc[0] += float(x.sum())
    acc[1] += float((x * x).sum())
    acc[2] += float(x.numel())


def compare_checksums(expected: dict[str, list[float]], actual: dict[str, list[float]], *,
                      where: str = "engine", rel_tol: float = 1e-9) -> None:
    """Raise WeightMismatchError naming the first tensor group that is missing or differs."""
    for group, exp in sorted(expected.items()):
        got = actual.get(group)
        if got is None:
            raise WeightMismatchError(f"{where}: tensor group {group!r} is missing after the weight sync")
        for label, e, g in zip(("sum", "sum of squares", "element count"), exp, got):
            if not math.isclose(e, g, rel_tol=rel_tol, abs_tol=1e-6):
                raise WeightMismatchError(
                    f"{where}: tensor group {group!r} differs from the trainer's after the weight sync "
                    f"({label}: trainer {e!r}, engine {g!r}); refusing to roll out on stale or corrupted weights")
