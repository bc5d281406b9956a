"""Config keys `rl-orch plan memory` plans but a run cannot use yet (issue 22): FP8 rollouts (the engine's FP8
weights and KV cache). The keys are in the schema so the planner can model them (`rl-orch plan memory --config ...
rollout.quantization=fp8`); `rl-orch run` (every `load_config` without plan_only) refuses them with the error below
instead of silently running without them. Context parallelism (trainer.context_parallel_size) is built
(actors/trainer/context_parallel.py); its config is checked here. FP8 training is built (actors/trainer/fp8.py,
checked by orchestrator/config/precision.py).

    check_context_parallel(cfg)      # ValueError: trainer.context_parallel_size must divide trainer.num_workers
    refuse_unbuilt(cfg)              # ValueError naming each key whose trainer / engine support is not built
"""
from __future__ import annotations


def check_context_parallel(cfg) -> None:
    """trainer.context_parallel_size (c) must divide trainer.num_workers (c of the D ranks share a sequence);
    with c > 1 the attention is the ring's, so trainer.attn_implementation must be "auto" or "sdpa" (SDPA is
    what the model runs outside context-parallel forwards).

    Raises ValueError naming the keys."""
    c, d = cfg.trainer.context_parallel_size, cfg.trainer.num_workers
    if d % c:
        raise ValueError(f"trainer.context_parallel_size={c} must divide trainer.num_workers={d} (each sequence is "
                         f"split over c of the trainer ranks)")
    impl = getattr(cfg.trainer, "attn_implementation", "auto")
    if c > 1 and impl not in ("auto", "sdpa"):
        raise ValueError(f"trainer.context_parallel_size={c} runs ring attention (actors/trainer/context_parallel.py): "
                         f"trainer.attn_implementation={impl} cannot be used with it; set auto or sdpa")


def unbuilt_settings(cfg) -> list[str]:
    """'key=value (what is missing)' for every set key whose support is not built yet; [] when none."""
    r = cfg.rollout
    out = []
    if r.quantization == "fp8":
        out.append("rollout.quantization=fp8 (FP8 engine weights and their verified weight sync are not built yet)")
    if r.kv_cache_dtype == "fp8":
        out.append("rollout.kv_cache_dtype=fp8 (the engine's FP8 KV cache is not wired yet)")
    return out


def refuse_unbuilt(cfg) -> None:
    """Raise ValueError when the config sets a key a run cannot honour yet (see unbuilt_settings)."""
    settings = unbuilt_settings(cfg)
    if settings:
        raise ValueError(f"{'; '.join(settings)}: rl-orch cannot run this yet; `rl-orch plan memory --config` plans "
                         "it (see docs/memory-planning.md). Remove the key(s) to run.")
