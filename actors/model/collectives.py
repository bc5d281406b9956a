"""The small collectives of the data-parallel ranks (the FSDP2 trainer, actors/trainer/sharded.py, and the PPO
critic, actors/critic_sharded.py): sums of metrics, the update guard's shared maximum, the busiest rank's
micro-batch count. Each is collective: every rank of the default group calls it at the same time with a list
of the same length. Tensors go on `device` (NCCL reduces CUDA tensors only; gloo CPU ones)."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def all_sum(values: list[float], device) -> list[float]:
    """The element-wise sum of `values` over the ranks (float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_sum_dict(sums: dict[str, float], device) -> dict[str, float]:
    """`all_sum` of a dict's values (the same keys on every rank), in sorted key order."""
    keys = sorted(sums)
    return dict(zip(keys, all_sum([sums[k] for k in keys], device)))


def all_max(values: list[float], device) -> list[float]:
    """The element-wise max of `values` over the ranks, NaN wins (the update guard of actors/trainer/finite.py
    decides the same on every rank)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    nan = torch.isnan(t).to(torch.float64)
    both = torch.cat([torch.nan_to_num(t, nan=0.0, posinf=math.inf), nan])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    out, seen = both[: len(values)], both[len(values):]
    return [math.nan if s > 0 else float(v) for v, s in zip(out.tolist(), seen.tolist())]


def most(count: int, device) -> int:
    """The largest `count` over the ranks (a rank with fewer micro-batches runs empty ones up to it)."""
    t = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)
