"""Flat buckets for a bucketed weight broadcast (pure torch: no Ray, no vLLM).

The sender flattens its named tensors, in a fixed order, into buckets of at most `bucket_mb` MiB (a
tensor larger than a bucket gets a bucket of its own). Every rank computes the same layout from the
same specs, so only the bytes travel at sync time. A bucket holds one dtype; a layout mixing dtypes
starts a new bucket at every dtype change.

    layout = plan_buckets([(name, shape, dtype), ...], bucket_mb=256)
    buf = torch.empty(bucket.numel, dtype=bucket.dtype); pack_bucket(named, bucket, buf)   # sender
    for name, t in unpack_bucket(buf, bucket): ...                                          # receiver
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import torch


@dataclass(frozen=True)
class TensorSlot:
    """One tensor's place in a bucket: elements [offset, offset + numel)."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass
class Bucket:
    """A flat buffer of `numel` elements of `dtype` holding `slots` back to back."""

    dtype: torch.dtype
    slots: list[TensorSlot] = field(default_factory=list)
    numel: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def tensor_specs(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of each tensor, in order: what `plan_buckets` needs."""
    return [(n, tuple(t.shape), t.dtype) for n, t in named]


def plan_buckets(specs: Sequence[tuple[str, Sequence[int], torch.dtype]], bucket_mb: float) -> list[Bucket]:
    """Greedy in-order packing of tensors into buckets of at most `bucket_mb` MiB.

    Raises ValueError for bucket_mb <= 0, an empty spec list or a repeated name.
    """
    if not bucket_mb > 0:
        raise ValueError(f"bucket_mb={bucket_mb!r} must be > 0")
    if not specs:
        raise ValueError("no tensors to sync: the spec list is empty")
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"repeated tensor names in the sync layout: {sorted({n for n in names if names.count(n) > 1})}")
    limit = bucket_mb * 2**20
    buckets: list[Bucket] = []
    for name, shape, dtype in specs:
        numel = math.prod(shape)
        size = numel * torch.empty((), dtype=dtype).element_size()
        cur = buckets[-1] if buckets else None
        if cur is None or cur.dtype != dtype or (cur.slots and cur.nbytes + size > limit):
            cur = Bucket(dtype=dtype)
            buckets.append(cur)
        cur.slots.append(TensorSlot(name, tuple(shape), cur.numel, numel))
        cur.numel += numel
    return buckets


def pack_bucket(named: Mapping[str, torch.Tensor], bucket: Bucket, out: torch.Tensor) -> torch.Tensor:
    """Copy the bucket's tensors into `out` (1-D, >= bucket.numel elements of bucket.dtype); returns the
    filled view. Raises ValueError naming a tensor whose shape or dtype differs from the layout."""
    view = out[: bucket.numel]
    for s in bucket.slots:
        t = named[s.name]
        if tuple(t.shape) != s.shape or t.dtype != bucket.dtype:
            raise ValueError(f"tensor {s.name!r} is {tuple(t.shape)} {t.dtype}; the sync layout expects "
                             f"{s.shape} {bucket.dtype} (the model changed after the layout was agreed)")
        view[s.offset : s.offset + s.numel].copy_(t.reshape(-1))
    return view


def unpack_bucket(buf: torch.Tensor, bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """Views into `buf`, one per tensor, shaped as in the layout (no copy)."""
    if buf.numel() < bucket.numel or buf.dtype != bucket.dtype:
        raise ValueError(f"bucket buffer has {buf.numel()} {buf.dtype} elements; the layout needs "
                         f"{bucket.numel} {bucket.dtype}")
    return [(s.name, buf[s.offset : s.offset + s.numel].view(s.shape)) for s in bucket.slots]
