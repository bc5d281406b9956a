"""Bucket layout for the bucketed broadcast: sizes, order, dtype boundaries, exact pack/unpack."""
from __future__ import annotations

import pytest
import torch

from orchestrator.weight_sync.buckets import pack_bucket, plan_buckets, tensor_specs, unpack_bucket


def _named():
    g = torch.Generator().manual_seed(0)
    return [("a", torch.randn(256, 256, generator=g)),   # 256 KiB in fp32
            ("b", torch.randn(128, generator=g)),
            ("c", torch.randn(512, 1024, generator=g)),  # 2 MiB: larger than a 1 MiB bucket
            ("d", torch.randn(64, 64, generator=g))]


def test_greedy_in_order_layout_with_an_oversized_tensor_alone():
    buckets = plan_buckets(tensor_specs(_named()), bucket_mb=1)
    assert [[s.name for s in b.slots] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert buckets[0].numel == 256 * 256 + 128 and buckets[0].slots[1].offset == 256 * 256
    assert buckets[1].nbytes == 2 * 2**20


def test_a_dtype_change_starts_a_new_bucket():
    specs = [("x", (4,), torch.float32), ("y", (4,), torch.bfloat16), ("z", (4,), torch.bfloat16)]
    buckets = plan_buckets(specs, bucket_mb=1)
    assert [(b.dtype, len(b.slots)) for b in buckets] == [(torch.float32, 1), (torch.bfloat16, 2)]


def test_pack_then_unpack_is_exact():
    named = _named()
    tensors = dict(named)
    for bucket in plan_buckets(tensor_specs(named), bucket_mb=1):
        buf = torch.empty(bucket.numel + 7, dtype=bucket.dtype)  # a larger, reused buffer is fine
        view = pack_bucket(tensors, bucket, buf)
        for name, t in unpack_bucket(view, bucket):
            assert torch.equal(t, tensors[name]) and t.shape == tensors[name].shape


def test_bad_inputs_raise_clearly():
    with pytest.raises(ValueError, match="bucket_mb"):
        plan_buckets(tensor_specs(_named()), bucket_mb=0)
    with pytest.raises(ValueError, match="empty"):
        plan_buckets([], bucket_mb=1)
    with pytest.raises(ValueError, match="repeated"):
        plan_buckets([("a", (2,), torch.float32), ("a", (2,), torch.float32)], bucket_mb=1)
    bucket = plan_buckets(tensor_specs(_named()), bucket_mb=1)[0]
    with pytest.raises(ValueError, match="'a'"):
        pack_bucket({"a": torch.zeros(3), "b": torch.zeros(128)}, bucket, torch.empty(bucket.numel))
    with pytest.raises(ValueError, match="layout needs"):
        unpack_bucket(torch.empty(10), bucket)
