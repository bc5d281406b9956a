"""FP8 training of the policy's linear layers (`trainer.precision: fp8`) with torchao's float8 training recipe.

`apply_fp8(model)` swaps every eligible `nn.Linear` of the model for torchao's `Float8Linear`
(`torchao.float8.convert_to_float8_training`, the recipe torchtitan uses): the forward and backward matmuls run in
FP8 with dynamic per-tensor scaling (inputs and weights in e4m3, output gradients in e5m2; Micikevicius et al. 2022,
"FP8 Formats for Deep Learning", sec. 3-4), while the module's parameters stay what they were, the fp32 master
weights: gradients, AdamW's states, the state dict (so the weight sync, the HF `policy/` folder and checkpoints see
the same names and dtypes as without FP8) are unchanged. The rest of the model (embeddings, norms, attention's
softmax, the LM head) runs as `trainer.precision=bf16-autocast` on a GPU and in fp32 on the CPU.

Eligible layers: `nn.Linear` whose in and out features are multiples of 16 (the FP8 GEMM's alignment) and that are
not the output projection (`lm_head`: the logits feed the log-softmax of the policy's log-probabilities, which
low-precision logits bias; torchtitan and NeMo keep it in high precision too).

Hardware: FP8 tensor cores need compute capability >= 8.9 (Ada, Hopper, Blackwell); an older GPU is refused
(`check_fp8_device`). On the CPU torch computes the FP8 matmuls in software: slow, but the same rounding, which is
what the CPU tests check. Not combined with LoRA (its adapters are small, unaligned matmuls; refused at load).

    model = apply_fp8(model)          # before FSDP sharding (torchao's order); returns the same object
    n = count_fp8_linears(model)      # how many layers were converted
"""
from __future__ import annotations

from typing import Optional

import torch

MIN_CAPABILITY = (8, 9)
ALIGN = 16
SKIP_NAMES = ("lm_head",)


class FP8Unsupported(RuntimeError):
    """trainer.precision=fp8 on a device without FP8 support, or without torchao."""


def check_fp8_device(device: Optional[str] = None) -> None:
    """Raise FP8Unsupported naming trainer.precision when `device` (default: cuda if available, else cpu) is a
    GPU of compute capability < 8.9, or when torchao is not installed. The CPU passes (software FP8)."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise FP8Unsupported(f"trainer.precision=fp8 needs torchao (pip install 'rl-orchestrator[fp8]'): {e}") from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not str(device).startswith("cuda"):
        return
    cap = torch.cuda.get_device_capability(torch.device(device))
    if tuple(cap) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(torch.device(device))
        raise FP8Unsupported(f"trainer.precision=fp8: {name} (compute capability {cap[0]}.{cap[1]}) has no FP8 tensor "
                             f"cores; FP8 training needs >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (Ada, Hopper, "
                             "Blackwell). Use trainer.precision=bf16-autocast")


def eligible(module: torch.nn.Module, fqn: str) -> bool:
    """True for an nn.Linear with in/out features divisible by 16 that is not the LM head (module docstring)."""
    if not isinstance(module, torch.nn.Linear) or fqn.split(".")[-1] in SKIP_NAMES:
        return False
    return module.in_features % ALIGN == 0 and module.out_features % ALIGN == 0


def apply_fp8(model: torch.nn.Module) -> torch.nn.Module:
    """Convert `model`'s eligible linear layers to torchao's Float8Linear in place (module docstring) and return it.

    Raises FP8Unsupported (see `check_fp8_device`) for the model's device, and ValueError when no layer is
    eligible (a model whose widths are not multiples of 16 would silently train without FP8)."""
    device = next(model.parameters()).device
    check_fp8_device(str(device))
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    # pad_inner_dim: the weight gradient's matmul has the micro-batch's token count as its inner dimension, which
    # the FP8 GEMM needs to be a multiple of 16 (an H200 raised "Expected trailing dimension of mat1 to be divisible
    # by 16" for 4 x 9 tokens); torchao pads it with zeros, which add nothing to the product
    convert_to_float8_training(model, config=Float8LinearConfig(pad_inner_dim=True), module_filter_fn=eligible)
    if count_fp8_linears(model) == 0:
        raise ValueError("trainer.precision=fp8: no linear layer of the model has in/out features divisible by 16; "
                         "nothing would run in FP8")
    return model


def count_fp8_linears(model: torch.nn.Module) -> int:
    """The number of torchao Float8Linear modules in `model` (0 without torchao)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return 0
    return sum(isinstance(m, Float8Linear) for m in model.modules())
