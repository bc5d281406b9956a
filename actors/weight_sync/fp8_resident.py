"""Engine side of the FP8 verification (orchestrator/weight_sync/fp8_check.py explains the scheme).

vLLM's online FP8 (`quantization="fp8_per_tensor"`) quantises a linear layer in its method's
`process_weights_after_loading(layer)`, which vLLM's layerwise reload runs for every layer once all its weights
of a sync were loaded (the worker's `reload_weights`: `initialize_layerwise_reload`, `model.load_weights` over the
streamed buckets, `finalize_layerwise_reload`). `FP8Verifier.install(model)` wraps that method of every online-FP8
layer: the wrapper keeps the layer's high-precision weight (fused and sharded as the loader assembled it), lets
vLLM quantise it, re-quantises it with vLLM's own kernel (`ops.scaled_fp8_quant`, the scale as vLLM derives it)
and records whether the layer's FP8 weight and scale equal that bit for bit, with their fingerprints.
`report(model)` fingerprints the resident tensors again (after vLLM copied them into the engine's kernel
storage). CUDA only: vLLM's CPU build has no FP8 kernels (tests/gpu/test_fp8_rollout_gpu.py).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from orchestrator.weight_sync.fp8_check import FP8_E4M3_MAX, expect_layer, fp8_scale, resident_error


def online_fp8_layers(model: torch.nn.Module) -> dict:
    """{module name: layer} of the layers whose quant method is vLLM's online FP8 linear method."""
    from vllm.model_executor.layers.quantization.online.fp8 import OnlineLinearBase

    return {n: m for n, m in model.named_modules() if isinstance(getattr(m, "quant_method", None), OnlineLinearBase)}


def _tp_sharded(layer) -> bool:
    """Whether the layer's weight is a shard along a dim its amax reduces over (vLLM's rule for per-tensor FP8)."""
    if getattr(layer, "tp_size", 1) == 1:
        return False
    return layer.input_size != layer.input_size_per_partition or layer.output_size != layer.output_size_per_partition


def _vllm_quant(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    from vllm import _custom_ops as ops

    return ops.scaled_fp8_quant(w, scale=scale)[0]


class FP8Verifier:
    """Records, per online-FP8 layer, whether vLLM's quantisation of the loaded weights is bit-exact."""

    def __init__(self, quant: Optional[Callable] = None, fp8_max: Optional[float] = None,
                 reduce: Optional[Callable] = None):
        """quant(w, scale) -> FP8 tensor, fp8_max, reduce(layer, amax) -> amax: vLLM's own (`ops.scaled_fp8_quant`,
        its FP8 maximum, the max over tensor-parallel shards) when None; tests pass torch references."""
        self.records: dict[str, dict] = {}
        self.installed = 0
        self.quant, self.fp8_max, self.reduce = quant, fp8_max, reduce

    def install(self, model: torch.nn.Module) -> int:
        """Wrap `process_weights_after_loading` of every online-FP8 layer's method (once). Returns the count."""
        if self.installed:
            return self.installed
        for name, layer in online_fp8_layers(model).items():
            method = layer.quant_method
            method.process_weights_after_loading = self._wrap(name, method, method.process_weights_after_loading)
            self.installed += 1
        return self.installed

    def begin(self) -> None:
        """A new version is about to load: forget the last one's records (a layer the sync leaves out is an
        error, not verified by an older record)."""
        self.records.clear()

    def _wrap(self, name: str, method, original):
        def checked(layer) -> None:
            w = method.get_weight_for_quantization(layer)  # high precision, as the loader assembled it
            if w.element_size() == 1:  # already quantised: vLLM's method returns without processing again
                return original(layer)
            original(layer)
            self.records[name] = self.expect(layer, w)
            return None

        return checked

    def expect(self, layer, w: torch.Tensor) -> dict:
        """The layer's record after vLLM quantised `w` (expect_layer's dict)."""
        if self.quant is None:
            from vllm.model_executor.layers.quantization.utils import quant_utils as qu

            amax_for_tp_weight_quant, get_fp8_min_max = qu.amax_for_tp_weight_quant, qu.get_fp8_min_max
            self.quant, self.fp8_max = _vllm_quant, get_fp8_min_max()[1]
            self.reduce = lambda lay, a: amax_for_tp_weight_quant(a, _tp_sharded(lay))
        reduce = None if self.reduce is None else (lambda a: self.reduce(layer, a))
        scale = fp8_scale(w, self.fp8_max or FP8_E4M3_MAX, reduce)
        return expect_layer(layer.weight, layer.weight_scale, self.quant(w, scale), scale)

    def report(self, model: torch.nn.Module) -> Optional[dict]:
        """{"layers": n, "errors": {layer: what}} over the online-FP8 layers (None for a model without them);
        a layer never loaded through a sync is an error."""
        layers = online_fp8_layers(model)
        if not layers:
            return None
        errors = {}
        for name, layer in layers.items():
            rec = self.records.get(name)
            err = "not re-quantised by a weight sync" if rec is None else resident_error(
                rec, layer.weight, layer.weight_scale)
            if err:
                errors[name] = err
        return {"layers": len(layers), "errors": errors}
