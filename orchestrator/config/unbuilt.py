"""Config keys `rl-orch plan memory` plans but a run cannot use yet (issue 22): context parallelism (FP8 training is
built: actors/trainer/fp8.py, checked by orchestrator/config/precision.py; FP8 rollouts are built for CUDA engines:
orchestrator/config/fp8_rollout.py). The keys
are in the schema so the planner can model them (`rl-orch plan memory --config ... trainer.context_parallel_size=4`); `rl-orch run` (every `load_config` without plan_only) refuses
them with the error below instead of silently training without them.

    check_context_parallel(cfg)      # ValueError: trainer.context_parallel_size must divide trainer.num_workers
    refuse_unbuilt(cfg)              # ValueError naming each key whose trainer / engine support is not built
"""
from __future__ import annotations


def check_context_parallel(cfg) -> None:
    """trainer.context_parallel_size (c) must divide trainer.num_workers (c of the D ranks share a sequence).

    Raises ValueError naming both keys."""
    c, d = cfg.trainer.context_parallel_size, cfg.trainer.num_workers
    if d % c:
        raise ValueError(f"trainer.context_parallel_size={c} must divide trainer.num_workers={d} (each sequence is "
                         f"split over c of the trainer ranks)")


def unbuilt_settings(cfg) -> list[str]:
    """'key=value (what is missing)' for every set key whose support is not built yet; [] when none."""
    t = cfg.trainer
    out = []
    if t.context_parallel_size > 1:
        out.append(f"trainer.context_parallel_size={t.context_parallel_size} (the trainer's ring attention over "
                   "ranks is not built yet: only the attention, orchestrator/algo/ring_attention.py and ring_dist.py)")
    return out


def refuse_unbuilt(cfg) -> None:
    """Raise ValueError when the config sets a key a run cannot honour yet (see unbuilt_settings)."""
    settings = unbuilt_settings(cfg)
    if settings:
        raise ValueError(f"{'; '.join(settings)}: rl-orch cannot run this yet; `rl-orch plan memory --config` plans "
                         "it (see docs/memory-planning.md). Remove the key(s) to run.")
