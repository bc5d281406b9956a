"""The load-time check of context parallelism (`trainer.context_parallel_size`, actors/model/context_parallel.py).
The other long-sequence keys are checked by orchestrator/config/precision.py (FP8 training) and
orchestrator/config/fp8_rollout.py (FP8 rollouts).

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
        raise ValueError(f"trainer.context_parallel_size={c} runs ring attention (actors/model/context_parallel.py): "
                         f"trainer.attn_implementation={impl} cannot be used with it; set auto or sdpa")
