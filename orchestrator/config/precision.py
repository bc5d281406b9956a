"""Load-time checks of `trainer.precision: fp8` (the trainer's FP8 linear layers, actors/trainer/fp8.py), so a run that
cannot train in FP8 fails before any actor starts:

- torchao must be installed (the `fp8` extra: pip install 'rl-orchestrator[fp8]'; `gpu` and `dev` include it);
- not with LoRA (`trainer.lora.rank > 0`): the frozen base layers sit inside peft's LoRA layers, whose small,
  unaligned adapter matmuls gain nothing from FP8;
- not on CPU placements (`placement.resource` other than GPU: CPU, fake_gpu): torch runs FP8 matmuls on the CPU in a
  reference kernel, far slower than fp32 (a 2-step demo run did not finish its first step in 11 minutes on 2 cores,
  against ~15 s in fp32); the CPU path is for tests only (tests/unit/test_fp8_training.py builds the Trainer directly);
- where this process sees a GPU (a single-node run), its compute capability must be >= 8.9. The trainer actor checks
  its own GPU again when it starts (a driver without a GPU cannot see the workers').

    check_precision(cfg)      # ValueError naming trainer.precision
"""
from __future__ import annotations

import importlib.util

MIN_CAPABILITY = (8, 9)


def check_precision(cfg) -> None:
    """Raise ValueError naming trainer.precision for an FP8 run that cannot run (module docstring)."""
    if cfg.trainer.precision != "fp8":
        return
    if importlib.util.find_spec("torchao") is None:
        raise ValueError("trainer.precision=fp8 needs torchao's float8 training: pip install 'rl-orchestrator[fp8]'")
    if cfg.placement.resource != "GPU":
        raise ValueError(f"trainer.precision=fp8 with placement.resource={cfg.placement.resource}: FP8 training needs "
                         "GPUs with FP8 tensor cores (compute capability >= 8.9); on the CPU torch computes FP8 "
                         "matmuls in a reference kernel, far slower than fp32. Use trainer.precision=fp32 on the CPU")
    if cfg.trainer.lora.rank > 0:
        raise ValueError(f"trainer.precision=fp8 with trainer.lora.rank={cfg.trainer.lora.rank}: FP8 training is not "
                         "combined with LoRA; use trainer.precision=bf16-autocast for LoRA")
    import torch

    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability(0)
        if tuple(cap) < MIN_CAPABILITY:
            raise ValueError(f"trainer.precision=fp8: this GPU ({torch.cuda.get_device_name(0)}, compute capability "
                             f"{cap[0]}.{cap[1]}) has no FP8 tensor cores (needs >= 8.9: Ada, Hopper, Blackwell); use "
                             "trainer.precision=bf16-autocast")
