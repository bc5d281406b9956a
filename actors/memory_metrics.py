"""Peak memory of an actor's process, as `memory/<role>_peak_*_bytes` metrics (Prometheus
`rl_orch_memory_bytes{name="<role>_peak_..."}`, orchestrator/metrics/prometheus.py)."""
from __future__ import annotations

import resource

import torch


def peak_memory_metrics(role: str) -> dict[str, float]:
    """This process's peak memory so far, in bytes: `memory/<role>_peak_allocated_bytes` (the CUDA caching
    allocator's peak, `torch.cuda.max_memory_allocated`: for a vLLM engine its weights and the KV cache it
    preallocated) on a GPU, else `memory/<role>_peak_rss_bytes` (getrusage ru_maxrss, KiB on Linux).
    `role`: "trainer", "rollout", ... Raises ValueError for an empty role."""
    if not role:
        raise ValueError("role: empty; give the actor's role (trainer, rollout, ...)")
    if torch.cuda.is_available():
        return {f"memory/{role}_peak_allocated_bytes": float(torch.cuda.max_memory_allocated())}
    return {f"memory/{role}_peak_rss_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0}
