"""The planner's long-context terms against hand-computed bytes (orchestrator/memory/longctx.py): context
parallelism, FP8 training, FP8 rollouts; the seeds' 70B figure; the docs' 32k-token worked example through
`rl-orch plan memory`; the config keys (the FP8 ones planned only: a run refuses them; context parallelism
runs)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import ConfigError, load_config
from orchestrator.memory import estimate as est
from orchestrator.memory import longctx
from orchestrator.memory.estimate import RunShape
from orchestrator.memory.params import PRESETS
from orchestrator.memory.shapes import model_shape, shape_from_numbers

CPU_YAML = "configs/grpo_arith_cpu.yaml"
DOC = Path(__file__).resolve().parents[2] / "docs" / "memory-planning.md"
# h = 64, I = 128, 4 heads / 2 KV heads of 16, vocab 100. Per layer: q, o 64*64 each, k, v 64*32 each
# (12288), MLP 3*64*128 (24576), 2 norms (128) = 36992; outside: embedding + head 2*100*64 + final norm 64
SMALL = shape_from_numbers(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=100)


def test_small_model_counts():
    assert SMALL.layer_params == 36992 and SMALL.num_params == 2 * 36992 + 12864
    assert longctx.linear_layer_params(SMALL) == 36864 and longctx.linear_params(SMALL) == 73728


def test_ring_kv_buffers():
    run = RunShape(context_parallel=4, trainer_ranks=4)
    # 2 (K, V) x 2 (send, receive) x 1000 / 4 tokens x 2 KV heads x 16 head dim x 2 bytes
    assert longctx.ring_kv_bytes(SMALL, 1000, run, 2) == 2 * 2 * 250 * 2 * 16 * 2 == 64000
    assert longctx.ring_kv_bytes(SMALL, 1000, RunShape(), 2) == 0


def test_context_parallelism_divides_activations_and_logits():
    run = RunShape(seq_len=1024, response_len=512, context_parallel=4, trainer_ranks=4)
    # logits: 4 fp32 [N, V] buffers, N = 512 scored tokens / 4 ranks
    assert est.logits_bytes(SMALL, run) == 4 * 4 * 128 * 100
    # per layer and token (bf16-autocast, sdpa): 16h + 10h + 4h*2 + 4I*2 + 8 + heads*4 + key span * 2,
    # key span 1024 / 4 = 256 -> 1024 + 640 + 512 + 1024 + 8 + 16 + 512 = 3736
    assert est.layer_activation_bytes(SMALL, "bf16-autocast", "sdpa", 256) == 3736
    # 2 layers x 256 tokens x 3736 + final norm 256 x 8h + LM head input 128 scored x h x 2
    assert est.activation_bytes(SMALL, run) == 2 * 256 * 3736 + 256 * 8 * 64 + 128 * 64 * 2
    # the trainer rank adds the ring's buffers to its activations; model states divide by all 4 ranks
    parts = est.trainer_bytes(SMALL, run)
    copies = 2 * SMALL.layer_params * 2  # FSDP: two all-gathered layers in bf16
    assert parts["activations"] == est.activation_bytes(SMALL, run) + copies + 2 * 2 * 256 * 2 * 16 * 2
    assert parts["weights"] == SMALL.num_params * 4 // 4 and parts["logits"] == 204800


def test_a_frozen_forward_is_whole_unless_split():
    """A reward model (or DPO's reference) is one un-split process: c does not divide its tokens. Transient:
    1024 tokens x (2h + 3I) x 4 bytes; logits: 2 fp32 [512 scored, V] buffers. (The GRPO reference's c ranks:
    tests/unit/test_reference_cp.py.)"""
    split = est.frozen_forward_bytes(SMALL, RunShape(seq_len=1024, response_len=512, context_parallel=4, trainer_ranks=4))
    assert split == est.frozen_forward_bytes(SMALL, RunShape(seq_len=1024, response_len=512))
    assert split["activations"] == 1024 * (2 * 64 + 3 * 128) * 4 and split["logits"] == 2 * 4 * 512 * 100


def test_fp8_training_terms():
    # saved linear inputs: q, k, v, gate, up 2 -> 1 byte (5h) + down's input 2 -> 1 (I) - o_proj's cast (h)
    assert longctx.fp8_linear_input_saving(SMALL) == 4 * 64 + 128 == 384
    # the trainer's recipe is torchao's (actors/trainer/fp8.py), which saves bf16 inputs: activations as bf16
    bf16 = est.layer_activation_bytes(SMALL, "bf16-autocast", "sdpa", 512)
    assert est.layer_activation_bytes(SMALL, "fp8", "sdpa", 512) == bf16
    # weight copies: linear projections at 1 byte, the rest (embedding, head, norms) at 2
    assert longctx.weight_copy_bytes(SMALL, 2, fp8=True) == 73728 + (SMALL.num_params - 73728) * 2 == 99968
    assert longctx.weight_copy_bytes(SMALL, 2, fp8=False) == SMALL.num_params * 2 == 173696
    run = RunShape(seq_len=512, response_len=256)
    a, b = est.trainer_bytes(SMALL, run), est.trainer_bytes(SMALL, dataclasses.replace(run, precision="fp8"))
    for key in ("weights", "grads", "optimizer", "logits"):  # master weights, grads, AdamW: unchanged
        assert a[key] == b[key]
    assert a["activations"] - b["activations"] == 173696 - 99968  # only the weight copies shrink


def test_fp8_rollout_weights_and_kv_cache():
    assert longctx.engine_weight_bytes(SMALL, 2, fp8=True) == 99968
    run = RunShape(max_model_len=1000, block_size=16)
    kv8 = dataclasses.replace(run, engine_fp8=True, kv_cache_bytes=1)
    # one 1000-token sequence = 63 blocks of 16 tokens x 2 (K, V) x 2 layers x 2 KV heads x 16 dim x bytes
    assert est.min_kv_bytes(SMALL, run) == 1008 * 2 * 2 * 2 * 16 * 2
    assert est.min_kv_bytes(SMALL, kv8) == 1008 * 2 * 2 * 2 * 16 * 1
    assert est.kv_blocks(10 ** 6, SMALL, kv8) == 2 * est.kv_blocks(10 ** 6, SMALL, run)
    assert est.engine_bytes(SMALL, dataclasses.replace(kv8, device="cpu"), 0, 0)["weights"] == 99968


def test_70b_in_fp16_holds_about_140_gb():
    shape = model_shape(PRESETS["llama3-70b"], name="llama3-70b")
    fp16 = longctx.engine_weight_bytes(shape, 2, fp8=False)
    assert 139e9 < fp16 < 143e9  # the seeds: "70B in FP16 holds about 140 GB of weights"
    fp8 = longctx.engine_weight_bytes(shape, 2, fp8=True)  # embedding and head (2 x 1.05e9) stay 2 bytes
    assert fp8 == longctx.linear_params(shape) + (shape.num_params - longctx.linear_params(shape)) * 2
    assert 71e9 < fp8 < 74e9


EXAMPLE = ["plan", "memory", "--model", "qwen2.5-7b", "--device-gib", "80", "--trainer-gpus", "8", "--engines", "8",
           "--colocate", "--grad-ckpt", "--seq-len", "32768", "--response-len", "31744", "--max-model-len", "32768",
           "--gpu-memory-utilization", "0.3"]


def test_worked_32k_example_fits_with_c4_not_c1(capsys):
    assert main(EXAMPLE) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out
    assert "trainer.context_parallel_size=4 (ring attention): fits" in out
    assert "[not in rl-orch yet" not in out  # context parallelism runs (actors/model/context_parallel.py)
    assert main(EXAMPLE + ["--context-parallel", "4"]) == 0
    fits = capsys.readouterr().out
    doc = DOC.read_text()
    for line in fits.splitlines()[3:6] + out.splitlines()[3:5]:  # the docs print these tables verbatim
        assert line in doc, line


def test_cli_context_parallel_must_divide_the_trainer_gpus(capsys):
    assert main(["plan", "memory", "--model", "llama3-8b", "--trainer-gpus", "2", "--context-parallel", "4"]) == 2
    assert "--context-parallel" in capsys.readouterr().err


def test_config_keys_are_planned_and_a_cpu_run_refuses_fp8_engines(tmp_path, capsys):
    with pytest.raises(ConfigError, match="trainer.context_parallel_size=2 must divide trainer.num_workers=1"):
        load_config(CPU_YAML, ["trainer.context_parallel_size=2"], plan_only=True)
    keys = ["trainer.num_workers=2", "trainer.context_parallel_size=2", "trainer.precision=fp8",
            "rollout.quantization=fp8", "rollout.kv_cache_dtype=fp8"]
    for key in keys[3:]:  # FP8 rollouts run on CUDA engines only (orchestrator/config/fp8_rollout.py)
        with pytest.raises(ConfigError, match=f"{key}.* needs CUDA GPUs"):
            load_config(CPU_YAML, ["rollout.dtype=bfloat16", key])
    # context parallelism is built (actors/model/context_parallel.py): a run takes it, with SDPA-class attention
    assert load_config(CPU_YAML, keys[:2]).trainer.context_parallel_size == 2
    with pytest.raises(ConfigError, match="trainer.attn_implementation=eager cannot be used with it"):
        load_config(CPU_YAML, keys[:2] + ["trainer.attn_implementation=eager"])
    cfg = load_config(CPU_YAML, keys, plan_only=True)
    assert cfg.trainer.context_parallel_size == 2
    folder = tmp_path / "small"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(PRESETS["smollm2-135m"], num_hidden_layers=2)))
    assert main(["plan", "memory", "--config", CPU_YAML, f"model.path={folder}", *keys]) in (0, 1)
    out = capsys.readouterr().out  # pre-flight's own plan_for_config reads the keys
    assert "fp8, 2 trainer rank(s)" in out and "context parallel c=2, FP8 rollout weights + KV cache" in out
    assert main(["run", CPU_YAML, f"model.path={folder}", *keys]) == 2
    assert "needs GPUs" in capsys.readouterr().err  # FP8 training (and engines) on this CPU machine


def test_long_context_candidates():
    cands = longctx.long_context_candidates(RunShape(trainer_ranks=2, context_parallel=2))
    cp = [(text, changes) for kind, text, changes in cands if kind == "cp"]
    # c = 4 needs 4 ranks (the fewest that 4 divides), c = 2 (the current one) is not offered
    assert cp[0] == ("trainer.num_workers=4 + trainer.context_parallel_size=4 (ring attention)",
                     dict(context_parallel=4, trainer_ranks=4))
    assert [k for k, _, _ in cands if k != "cp"] == ["fp8-train", "fp8-rollout", "fp8-rollout"]
    done = RunShape(precision="fp8", engine_fp8=True, kv_cache_bytes=1, context_parallel=64, trainer_ranks=64)
    assert longctx.long_context_candidates(done) == []


def test_a_long_single_gpu_run_is_told_to_add_context_parallel_ranks(capsys):
    argv = ["plan", "memory", "--model", "llama3-8b", "--seq-len", "32768", "--response-len", "30000", "--grad-ckpt"]
    assert main(argv) == 1
    assert "trainer.num_workers=4 + trainer.context_parallel_size=4 (ring attention): fits" in capsys.readouterr().out
