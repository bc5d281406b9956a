"""The trainer's AdamW runs torch's fused kernel, also after loading a checkpoint written without it."""
from __future__ import annotations

import torch

from actors.trainer.trainer import _fused_ok, keep_fused


def test_a_checkpoint_without_fused_gets_the_fused_kernel_back():
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    old = torch.optim.AdamW(params, lr=1e-3)  # an older trainer's optimizer: fused=None, per-tensor loop
    for p in params:
        p.grad = torch.ones_like(p)
    old.step()
    new = torch.optim.AdamW(params, lr=1e-3, fused=_fused_ok(params))
    new.load_state_dict(old.state_dict())
    assert new.param_groups[0]["fused"] is None  # what torch's load_state_dict leaves
    keep_fused(new)
    assert new.param_groups[0]["fused"] is True and new.param_groups[0]["foreach"] is None
    new.step()  # runs the fused kernel with the loaded state
    assert all(torch.isfinite(p).all() for p in params)


def test_fused_needs_float_cpu_or_cuda_tensors():
    assert _fused_ok([torch.zeros(2)])
    assert not _fused_ok([]) and not _fused_ok([torch.zeros(2, dtype=torch.int64)])
