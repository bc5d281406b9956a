"""Which attention kernel the trainer and the reference model load (`trainer.attn_implementation`).

Packed rows (trainer.packing) hold several sequences one after another with position ids restarting at 0.
transformers turns restarting position ids into a block-diagonal mask for SDPA/eager (case C11: no token
attends across a boundary; cost quadratic in the row length) and into variable-length FlashAttention-2
calls (`flash_attn_varlen_func` with cumulative sequence lengths: each sequence attends only to itself, no
mask materialised) when the model is loaded with `attn_implementation="flash_attention_2"`.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

CHOICES = ("auto", "sdpa", "eager", "flash_attention_2")


def flash_attn_available() -> bool:
    """Whether the `flash_attn` package (FlashAttention-2, CUDA only) is importable."""
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(requested: str, *, on_cuda: bool, packing: bool, precision: str,
                                flash_available: bool) -> Optional[str]:
    """The transformers `attn_implementation` to load.

    "auto": "flash_attention_2" on a GPU with `flash_attn` installed, packed rows and a half-precision
    compute dtype (precision "bf16-autocast": FlashAttention has no fp32 kernel), else None (transformers'
    default for the architecture: SDPA where the model supports it, else eager). Explicit values are
    returned as given after checking them.

    Raises ValueError naming trainer.attn_implementation for an unknown value, or for
    "flash_attention_2" without a GPU, without `flash_attn`, or with precision "fp32".
    """
    if requested not in CHOICES:
        raise ValueError(f"trainer.attn_implementation={requested!r}: must be one of {list(CHOICES)}")
    if requested == "auto":
        use_flash = on_cuda and flash_available and packing and precision != "fp32"
        return "flash_attention_2" if use_flash else None
    if requested == "flash_attention_2":
        if not on_cuda:
            raise ValueError("trainer.attn_implementation=flash_attention_2 needs a CUDA GPU; use sdpa on CPU")
        if not flash_available:
            raise ValueError("trainer.attn_implementation=flash_attention_2: the flash_attn package is not "
                             "installed (pip install flash-attn --no-build-isolation), or use sdpa")
        if precision == "fp32":
            raise ValueError("trainer.attn_implementation=flash_attention_2 has no fp32 kernel: set "
                             "trainer.precision=bf16-autocast, or use sdpa")
    return requested


def attn_implementation_for(trainer_cfg, packing: bool) -> Optional[str]:
    """`resolve_attn_implementation` for this process (its GPU and installed packages) and `trainer_cfg`
    (TrainerConfig: attn_implementation, precision). With trainer.context_parallel_size > 1 the ring attention
    (actors/model/context_parallel.py: SDPA outside context-parallel forwards); trainer.attn_implementation
    must then be "auto" or "sdpa" (orchestrator/config/context_parallel.py checks it when the config loads)."""
    import torch

    if getattr(trainer_cfg, "context_parallel_size", 1) > 1:
        from actors.model.context_parallel import RING_ATTENTION  # the import registers it with transformers

        return RING_ATTENTION

    return resolve_attn_implementation(getattr(trainer_cfg, "attn_implementation", "auto"),
                                       on_cuda=torch.cuda.is_available(), packing=packing,
                                       precision=trainer_cfg.precision, flash_available=flash_attn_available())


def load_kwargs(impl: Optional[str]) -> dict:
    """`from_pretrained` keyword arguments for `impl` (none for None: transformers' default)."""
    return {} if impl is None else {"attn_implementation": impl}
