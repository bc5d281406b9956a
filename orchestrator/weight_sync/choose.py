"""`weight_sync.strategy: auto` for a run's config: the cost model's cheapest strategy (pure: no Ray).

    strategy, table = choose_for_config(cfg, num_params, nbytes)   # the job asks the trainer for the sizes
"""
from __future__ import annotations

from orchestrator.weight_sync import setup_from_fabric
from orchestrator.weight_sync.registry import choose_strategy, outside_ray_names, predict_sync

# Prior changed fraction for `auto` before any delta was measured: every fp32 element moves after an
# Adam step; 16-bit weights mostly keep their bits at RL learning rates (benchmarks/RESULTS.md measures it).
_PRIOR_CHANGED_FRACTION = {"float32": 1.0, "bfloat16": 0.25, "float16": 0.25}


def choose_for_config(cfg, num_params: int, nbytes: int) -> tuple[str, str]:
    """`weight_sync.strategy: auto`: the cheapest strategy predicted by the cost model for this run's
    model size, engine count and `weight_sync.fabric`; returns (strategy, the prediction table)."""
    f, ws = cfg.weight_sync.fabric, cfg.weight_sync
    setup = setup_from_fabric(num_params, nbytes / max(num_params, 1), cfg.rollout.num_workers, 1, f.engine_nodes,
                              intra=f.intra_node, inter=f.inter_node, fs_write_gbps=f.fs_write_gbps,
                              fs_read_gbps=f.fs_read_gbps, bucket_mb=ws.bucket_mb,
                              changed_fraction=_PRIOR_CHANGED_FRACTION[cfg.rollout.dtype],
                              max_changed_fraction=ws.delta.max_changed_fraction)
    estimates = predict_sync(setup)
    table = "\n".join(f"  {k:<13} {e.seconds:9.3f} s predicted" for k, e in estimates.items())
    # rollout.engine=async_llm: only strategies whose receiver runs outside Ray (orchestrator/rollout/config.py)
    candidates = [n for n in outside_ray_names() if n in estimates] if cfg.rollout.engine == "async_llm" else None
    return choose_strategy(setup, candidates), table

