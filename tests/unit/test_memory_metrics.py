"""actors/memory_metrics.py: peak memory per role as `memory/<role>_peak_*_bytes`."""
from __future__ import annotations

import resource

import pytest
import torch

from actors.memory_metrics import peak_memory_metrics


def test_cpu_peak_rss_per_role(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU branch, on a host with CUDA too
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    big = torch.ones(64 * 2**20 // 4)  # touch 64 MiB: the peak can only grow
    big.add_(1.0)
    out = peak_memory_metrics("rollout")
    assert list(out) == ["memory/rollout_peak_rss_bytes"]
    assert out["memory/rollout_peak_rss_bytes"] >= before and out["memory/rollout_peak_rss_bytes"] >= 64 * 2**20
    assert list(peak_memory_metrics("trainer")) == ["memory/trainer_peak_rss_bytes"]


def test_empty_role_is_refused() -> None:
    with pytest.raises(ValueError, match="role: empty"):
        peak_memory_metrics("")
