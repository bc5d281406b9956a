"""FP8 rollouts without a GPU: the load-time checks, the engine arguments, the correction default, and the pure
half of the engine's FP8 verification (orchestrator/weight_sync/fp8_check.py; the engine half runs in
tests/gpu/test_fp8_rollout_gpu.py)."""
from __future__ import annotations

import logging

import pytest
import torch

from actors.rollout.vllm_engine import fp8_kwargs
from orchestrator.config import load_config
from orchestrator.config.fp8_rollout import fp8_correction_notes
from orchestrator.config.load import ConfigError
from orchestrator.weight_sync.checksum import WeightMismatchError
from orchestrator.weight_sync.fp8_check import (check_fp8_report, expect_layer, fingerprint, fp8_scale, merge_fp8,
                                                quantize_fp8, resident_error)

CPU_YAML = "configs/grpo_arith_cpu.yaml"
GPU = ["placement.resource=GPU", "rollout.dtype=bfloat16", "rollout.quantization=fp8"]


def test_load_time_checks_name_the_keys():
    with pytest.raises(ConfigError, match="rollout.quantization=fp8 needs rollout.dtype bfloat16 or float16"):
        load_config(CPU_YAML, ["placement.resource=GPU", "rollout.quantization=fp8", "rollout.dtype=float32"])
    with pytest.raises(ConfigError, match=r"rollout.quantization=fp8 and rollout.kv_cache_dtype=fp8 needs CUDA GPUs "
                                          r"\(placement.resource=GPU, got placement.resource='CPU'"):
        load_config(CPU_YAML, ["rollout.dtype=bfloat16", "rollout.quantization=fp8", "rollout.kv_cache_dtype=fp8"])
    with pytest.raises(ConfigError, match="placement.fake_gpus=2"):
        load_config(CPU_YAML, ["placement.resource=fake_gpu", "placement.fake_gpus=2", "rollout.kv_cache_dtype=fp8"])
    cfg = load_config(CPU_YAML, GPU + ["rollout.kv_cache_dtype=fp8"])
    assert fp8_kwargs(cfg.rollout) == {"quantization": "fp8_per_tensor", "kv_cache_dtype": "fp8"}
    assert fp8_kwargs(load_config(CPU_YAML).rollout) == {}


def test_the_correction_defaults_on_and_an_explicit_none_is_warned(caplog):
    with caplog.at_level(logging.INFO, logger="orchestrator.config.fp8_rollout"):
        cfg = load_config(CPU_YAML, GPU)  # defaults: token-level TIS, cap 2 (verl's FP8 recipe)
    assert cfg.algo.rollout_correction.mode == "none" and cfg.algo.tis_cap == 2.0
    assert "token-level truncated IS, algo.tis_cap=2.0 (the default" in caplog.text
    cfg = load_config(CPU_YAML, GPU + ["algo.tis_cap=null"])  # no cap, mode unset: IcePop's token mask
    assert cfg.algo.rollout_correction.mode == "token_mask"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="orchestrator.config.fp8_rollout"):
        cfg = load_config(CPU_YAML, GPU + ["algo.tis_cap=null", "algo.rollout_correction.mode=none"])
    assert cfg.algo.rollout_correction.mode == "none" and cfg.algo.tis_cap is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "no mismatch correction" in caplog.text
    assert fp8_correction_notes(load_config(CPU_YAML), set()) == []


def test_reference_quantisation_and_bit_exact_comparison():
    torch.manual_seed(0)
    w = (torch.randn(48, 32) * 0.05).to(torch.bfloat16)
    scale = fp8_scale(w)
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert scale.item() == pytest.approx(w.float().abs().max().item() / 448)
    q = quantize_fp8(w, scale)
    assert q.dtype == torch.float8_e4m3fn and q.float().abs().max().item() == 448.0
    assert (q.float() * scale - w.float()).abs().max() <= w.float().abs().max() / 16  # 3 mantissa bits
    resident = q.t().contiguous().t().t()  # vLLM keeps per-tensor FP8 weights as [in, out]
    rec = expect_layer(resident, scale.clone(), q, scale)
    assert rec["layout"] == "t" and resident_error(rec, resident, scale) is None
    assert expect_layer(q.clone(), scale, q, scale)["layout"] == "n"
    changed = resident.clone()
    changed.view(torch.uint8)[3, 5] ^= 1  # one bit of one FP8 value
    assert "differs from the re-quantisation" in expect_layer(changed, scale, q, scale)["error"]
    assert resident_error(rec, changed, scale) == "resident FP8 weight changed after the verified load"
    assert resident_error(rec, resident, scale * 2) == "resident FP8 scale changed after the verified load"
    assert "scale" in expect_layer(resident, scale * 2, q, scale)["error"]
    assert fingerprint(q) != fingerprint(q.flip(0)) and fingerprint(q) == fingerprint(q.clone())


def test_reports_are_checked_and_merged_over_tensor_parallel_workers():
    check_fp8_report({"groups": {}}, "rollout worker 0")  # a 16/32-bit engine: nothing to check
    check_fp8_report({"fp8": {"layers": 4, "errors": {}}}, "rollout worker 0")
    with pytest.raises(WeightMismatchError, match="rollout worker 1: FP8 layer 'a.qkv_proj': bad .1 of 4"):
        check_fp8_report({"fp8": {"layers": 4, "errors": {"a.qkv_proj": "bad"}}}, "rollout worker 1")
    with pytest.raises(WeightMismatchError, match="no FP8 layer verified"):
        check_fp8_report({"fp8": {"layers": 0, "errors": {}}}, "rollout worker 0")
    merged = merge_fp8([{"fp8": {"layers": 2, "errors": {}}}, {"fp8": {"layers": 2, "errors": {"x": "bad"}}}])
    assert merged == {"layers": 4, "errors": {"x (tp worker 1)": "bad"}}
    assert merge_fp8([{"groups": {}}]) is None


class _FakeMethod:
    """vLLM's online per-tensor FP8 method as far as the verifier sees it: quantises layer.weight in
    process_weights_after_loading and keeps it transposed, with a float32 scale [1]."""

    def __init__(self, bad: bool = False):
        self.bad = bad

    def get_weight_for_quantization(self, layer):
        return layer.weight

    def process_weights_after_loading(self, layer):
        scale = fp8_scale(layer.weight)
        q = quantize_fp8(layer.weight, scale * (1.01 if self.bad else 1.0))
        layer.weight, layer.weight_scale = q.t(), scale


def test_the_engine_verifier_wraps_the_fp8_methods_and_reports_resident_changes(monkeypatch):
    from actors.weight_sync import fp8_resident

    torch.manual_seed(1)
    layers = {}
    for name, bad in (("l0.qkv_proj", False), ("l0.down_proj", True), ("l1.o_proj", False)):
        layers[name] = torch.nn.Module()
        layers[name].quant_method = _FakeMethod(bad)
    monkeypatch.setattr(fp8_resident, "online_fp8_layers", lambda model: layers)
    verifier = fp8_resident.FP8Verifier(quant=quantize_fp8)
    assert verifier.install(None) == 3 and verifier.install(None) == 3  # wrapped once
    assert verifier.report(None)["errors"]["l1.o_proj"] == "not re-quantised by a weight sync"
    for name in ("l0.qkv_proj", "l0.down_proj"):  # a sync: the loader assembled the bf16 weight, vLLM processes it
        layers[name].weight = (torch.randn(24, 16) * 0.1).to(torch.bfloat16)
        layers[name].quant_method.process_weights_after_loading(layers[name])
    errors = verifier.report(None)["errors"]
    assert set(errors) == {"l0.down_proj", "l1.o_proj"} and "re-quantisation" in errors["l0.down_proj"]
    layers["l0.qkv_proj"].weight_scale = layers["l0.qkv_proj"].weight_scale * 2  # changed after the load
    assert verifier.report(None)["errors"]["l0.qkv_proj"] == "resident FP8 scale changed after the verified load"
    verifier.begin()  # the next version: nothing verified until it loads
    assert len(verifier.report(None)["errors"]) == 3


def test_the_worker_extension_verifies_an_fp8_engine_end_to_end_on_cpu(monkeypatch):
    """The extension's FP8 path with a fake engine (vLLM's CPU build has no FP8 kernels): a load through our
    weight-transfer engine re-quantises through the wrapped method, the FP8 group reports the stream's checksums
    (equal to the trainer's) and the FP8 check."""
    from functools import partial
    from types import SimpleNamespace

    import vllm.model_executor.model_loader.reload as reload

    from actors.weight_sync import base, fp8_resident, transfer_engine, vllm_extension
    from orchestrator.weight_sync.checksum import compare_checksums, group_checksums

    layer, norm = torch.nn.Module(), torch.nn.LayerNorm(4)
    layer.quant_method = _FakeMethod()

    class Model(torch.nn.Module):
        def load_weights(self, weights):  # vLLM's loader, as far as this model needs it
            for name, t in weights:
                if name == "mlp.down_proj.weight":
                    layer.weight = t
                    layer.quant_method.process_weights_after_loading(layer)
                else:
                    norm.get_parameter(name.split(".")[-1]).data.copy_(t)

    model = Model()
    model.mlp, model.norm = torch.nn.Module(), norm
    model.mlp.down_proj = layer
    layer.weight = torch.zeros(8, 4, dtype=torch.bfloat16)  # as after a first load
    layer.quant_method.process_weights_after_loading(layer)
    finder = lambda m: {n: x for n, x in m.named_modules() if isinstance(getattr(x, "quant_method", None), _FakeMethod)}
    monkeypatch.setattr(vllm_extension, "online_fp8_layers", finder)
    monkeypatch.setattr(transfer_engine, "online_fp8_layers", finder)
    monkeypatch.setattr(fp8_resident, "online_fp8_layers", finder)
    monkeypatch.setattr(transfer_engine, "FP8Verifier", partial(fp8_resident.FP8Verifier, quant=quantize_fp8))
    monkeypatch.setattr(base, "tp_position", lambda: (0, 1))
    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda m: None)  # no vLLM layers in this model
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda m, c: None)

    vllm_config = SimpleNamespace(parallel_config=None,
                                  model_config=SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=False)))
    w = vllm_extension.WeightReceiverExtension()
    w.model_runner = SimpleNamespace(get_model=lambda: model)
    w.weight_transfer_engine = transfer_engine.StrategyTransferEngine(None, vllm_config, torch.device("cpu"), model)
    torch.manual_seed(2)
    sent = [("mlp.down_proj.weight", torch.randn(8, 4).to(torch.bfloat16)), ("norm.weight", torch.rand(4)),
            ("norm.bias", torch.rand(4))]
    w.weight_transfer_engine.start_weight_update()
    w.weight_transfer_engine.update_weights({"strategy": "object_store", "payload": sent, "version": 1})
    w.weight_transfer_engine.finish_weight_update()
    rep = w.weight_checksums()
    compare_checksums(group_checksums(sent), rep["groups"])  # the stream (mlp) and the resident norm
    assert rep["packed_groups"] == ["mlp"] and rep["fp8"] == {"layers": 1, "errors": {}}
    check_fp8_report(rep, "rollout worker 0")
    assert w.corrupt_fp8_scale(2.0) == "mlp.down_proj"
    with pytest.raises(WeightMismatchError, match="FP8 layer 'mlp.down_proj': resident FP8 scale changed"):
        check_fp8_report(w.weight_checksums(), "rollout worker 0")
