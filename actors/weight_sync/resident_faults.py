"""Test hooks that change what an engine computes while bypassing its weight stream (the negative controls of the
logprob probe, orchestrator/weight_sync/probe.py): the checksums of what was loaded stay right, the output does not."""
from __future__ import annotations

import torch


def corrupt_resident_weights(model: torch.nn.Module, scale: float = 2.0, layer: str = "") -> dict:
    """Make one linear layer of `model` compute with its weight times `scale`. `layer`: a module name, default the
    first decoder layer's `mlp.down_proj`. A layer served by vLLM's CPU GEMM dispatch (`cpu_linear`, over a packed
    copy when its parameter was emptied) gets that kernel's output scaled; any other has its resident weight scaled in
    place. Returns {"layer": its name, "packed": whether its parameter is empty (packed away)}. Raises KeyError for an
    unknown `layer`. The next load rebuilds the layer and undoes this."""
    modules = dict(model.named_modules())
    name = layer or next(n for n in modules if n.endswith("layers.0.mlp.down_proj"))
    mod = modules[name]
    packed = mod.weight.numel() == 0
    if callable(getattr(mod, "cpu_linear", None)):
        inner = mod.cpu_linear
        mod.cpu_linear = lambda x, weight, bias: inner(x, weight, bias) * scale
    else:
        mod.weight.data.mul_(scale)
    return {"layer": name, "packed": packed}


def swap_resident_logits(model: torch.nn.Module, a: list[int], b: list[int]) -> None:
    """Make `model`'s logits of token ids `a[i]` and `b[i]` trade places, bypassing the weights: wrong output rows
    outside the sampled tokens, which leave every other token's logprob bit-equal (the probe's full-distribution check
    must catch it). Called again with the same ids, it undoes itself."""
    src, dst = list(a) + list(b), list(b) + list(a)
    inner = model.compute_logits

    def swapped(hidden_states, *args, **kwargs):
        logits = inner(hidden_states, *args, **kwargs)
        if logits is not None:
            logits[..., src] = logits[..., dst]
        return logits

    model.compute_logits = swapped
