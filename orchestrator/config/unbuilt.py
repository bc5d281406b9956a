"""Load-time checks of the long-sequence keys (issue 22). Every key `rl-orch plan memory` plans now runs: context
parallelism (actors/trainer/context_parallel.py), FP8 training (actors/trainer/fp8.py, checked by
orchestrator/config/precision.py) and FP8 rollouts on CUDA engines (orchestrator/config/fp8_rollout.py), so nothing
is refused as "not built" any more; what remains here is the context-parallel check.

    check_context_parallel(cfg)      # ValueError: trainer.context_parallel_size must divide trainer.num_workers
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
