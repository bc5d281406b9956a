"""VRAM planner (orchestrator/memory): published figures, case C13, hand-counted formulas, pre-flight."""
import json

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.memory.estimate import (GIB, RunShape, activation_bytes, frozen_forward_bytes, kv_blocks,
                                          kv_cache_budget, layer_activation_bytes, trainer_bytes)
from orchestrator.memory.params import PRESETS, ModelConfigError
from orchestrator.memory.planner import format_plan, plan_memory
from orchestrator.memory.preflight import FAST_PATH_ARCHS, MemoryPlanError, plan_for_config, preflight
from orchestrator.memory.shapes import model_shape, shape_from_numbers

LLAMA8 = model_shape(PRESETS["llama3-8b"], "llama3-8b")
LLAMA70 = model_shape(PRESETS["llama3-70b"], "llama3-70b")
MIB = 2 ** 20


# ---- case C13: KV cache per token counts key/value heads; the budget sits next to colocated memory ----
def test_c13_kv_bytes_per_token_and_block():
    assert LLAMA8.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072  # 128 KiB
    assert 16 * LLAMA8.kv_bytes_per_token(2) == 2 * MIB  # a 16-token block
    assert LLAMA8.kv_bytes_per_token(2) != 2 * 32 * 32 * 128 * 2  # the query-heads fault: 512 KiB


def test_c13_blocks_next_to_a_colocated_trainer():
    run = RunShape(engine_bytes=2, block_size=16)
    budget = kv_cache_budget(80 * GIB, 0.9, others_bytes=20 * GIB, engine_peak=16 * GIB)
    assert budget == 44 * GIB
    assert kv_blocks(budget, LLAMA8, run) == 22528
    # sizing from the total device (ignoring the trainer) is the fault: 56 GiB, 28672 blocks
    assert kv_blocks(kv_cache_budget(80 * GIB, 0.9, 0, 16 * GIB), LLAMA8, run) == 28672


def test_c13_in_a_plan_the_engine_gets_what_is_left_and_the_overcommit_is_reported():
    run = RunShape(lora_rank=16, colocated=("rollout",), gpu_memory_utilization=0.9, seq_len=512, response_len=256)
    plan = plan_memory(LLAMA8, run, 80 * GIB)
    trainer = next(r for r in plan.roles if r.role == "trainer")
    rollout = next(r for r in plan.roles if r.role == "rollout")
    assert rollout.total == 80 * GIB - trainer.total  # the engine fills what the trainer leaves, no more
    gpu = plan.devices[0]
    assert gpu.roles == ["trainer", "rollout"] and gpu.used_bytes == 80 * GIB
    assert not plan.fits and "gpu_memory_utilization <=" in gpu.problems[0]  # 0.9 * 80 > 80 - trainer
    assert any("rollout.gpu_memory_utilization=" in s for s in plan.suggestions)


# ---- published figures ---------------------------------------------------------------------------
def test_70b_holds_about_140_gb_of_fp16_weights():
    weights = frozen_forward_bytes(LLAMA70, RunShape(frozen_bytes=2))["weights"]
    assert 139e9 < weights < 142e9  # 70.55e9 parameters x 2 bytes


def test_8b_full_finetune_with_adamw_does_not_fit_24gb_but_lora_does():
    run = RunShape(precision="bf16-autocast", micro_batch_size=1, seq_len=512, response_len=256, engines=0)
    full = trainer_bytes(LLAMA8, run)
    states = full["weights"] + full["grads"] + full["optimizer"]
    assert states == 16 * LLAMA8.num_params  # ZeRO: 16 bytes per parameter under mixed-precision AdamW
    assert not plan_memory(LLAMA8, run, 24 * GIB).fits
    lora = RunShape(precision="bf16-autocast", micro_batch_size=1, seq_len=512, response_len=256, engines=0,
                    lora_rank=16, frozen_bytes=2)
    assert plan_memory(LLAMA8, lora, 24 * GIB).fits


def test_lora_parameter_count_matches_peft_for_llama3_8b():
    # peft prints "trainable params: 41,943,040" for r=16 on all seven projections of Llama-3-8B
    assert LLAMA8.lora_params(16) == 41_943_040


def test_zero3_shards_model_states_over_d_ranks():
    one, eight = (trainer_bytes(LLAMA70, RunShape(trainer_ranks=d)) for d in (1, 8))
    for part in ("weights", "grads", "optimizer"):
        assert eight[part] == one[part] // 8


# ---- activations: the per-layer count of layer_activation_bytes, by hand --------------------------
TINY = shape_from_numbers(layers=2, hidden=64, intermediate=128, heads=4, vocab=100, kv_heads=2)


def test_layer_activation_bytes_by_hand():
    # fp32: norms 16h + shared projection inputs 8h + attention 4h x 4 + MLP 4I x 4 + 8, SDPA: lse 4 x heads + mask 4s
    assert layer_activation_bytes(TINY, "fp32", "sdpa", 10) == 40 * 64 + 16 * 128 + 8 + 4 * 4 + 4 * 10  # 4672
    assert layer_activation_bytes(TINY, "fp32", "eager", 10) == 40 * 64 + 16 * 128 + 8 + 4 * 4 * 10  # softmax
    # bf16-autocast: norms 16h + five bf16 projection-input casts 10h + attention 4h x 2 + MLP 4I x 2
    assert layer_activation_bytes(TINY, "bf16-autocast", "sdpa", 10) == 34 * 64 + 8 * 128 + 8 + 4 * 4 + 2 * 10
    assert layer_activation_bytes(TINY, "bf16-autocast", "eager", 10) == 34 * 64 + 8 * 128 + 8 + 6 * 4 * 10


def test_layer_activation_bytes_match_the_saved_tensors_measured_for_a_smollm2_layer():
    # SmolLM2-135M widths (h 576, I 1536, 9 heads / 3 KV heads), 2 x 128 tokens with padding: the bytes
    # per token and layer saved for backward, measured with torch.autograd.graph.saved_tensors_hooks
    smol = model_shape(PRESETS["smollm2-135m"], "smollm2-135m")
    measured = {("fp32", "sdpa"): 48172, ("bf16-autocast", "sdpa"): 32172, ("fp32", "eager"): 52232,
                ("bf16-autocast", "eager"): 38792}
    for (precision, attention), value in measured.items():
        assert layer_activation_bytes(smol, precision, attention, 128) == value


def test_activation_bytes_with_and_without_checkpointing():
    run = RunShape(precision="fp32", micro_batch_size=3, seq_len=10, response_len=4)
    tokens, scored = 30, 12
    outside = tokens * 8 * 64 + scored * 64 * 4
    assert activation_bytes(TINY, run) == 2 * tokens * 4672 + outside
    ckpt = RunShape(precision="fp32", micro_batch_size=3, seq_len=10, response_len=4, gradient_checkpointing=True)
    assert activation_bytes(TINY, ckpt) == 2 * tokens * 64 * 4 + tokens * 4672 + outside


# ---- roles per algorithm and layouts --------------------------------------------------------------
@pytest.mark.parametrize("algorithm,reference,roles", [
    ("grpo", False, ["trainer", "rollout"]), ("grpo", True, ["trainer", "reference", "rollout"]),
    ("ppo", False, ["trainer", "critic", "rollout"]), ("dpo", False, ["trainer", "reference"])])
def test_resident_roles_per_algorithm(algorithm, reference, roles):
    plan = plan_memory(TINY, RunShape(algorithm=algorithm, reference=reference), 80 * GIB)
    assert [r.role for r in plan.roles] == roles


def test_cpu_run_puts_every_role_in_host_memory():
    plan = plan_memory(TINY, RunShape(device="cpu", kv_cache_gib=2, reference=True), 24 * GIB)
    assert len(plan.devices) == 1 and plan.devices[0].roles == ["trainer", "reference", "rollout"]
    assert plan.devices[0].used_bytes == sum(r.total for r in plan.roles)
    assert next(r for r in plan.roles if r.role == "rollout").parts["kv_cache"] == 2 * GIB


def test_suggestions_name_changes_that_fit():
    plan = plan_memory(LLAMA8, RunShape(seq_len=512, response_len=256), 24 * GIB)
    assert not plan.fits
    text = "\n".join(plan.suggestions)
    assert "trainer.lora.rank=16" in text and "trainer.num_workers=" in text
    assert "DOES NOT FIT" in format_plan(plan) and "changes that would make it fit" in format_plan(plan)


def test_bad_numbers_name_the_input():
    with pytest.raises(ModelConfigError, match="hidden"):
        shape_from_numbers(layers=2, hidden=0, intermediate=8, heads=2, vocab=10)
    with pytest.raises(ModelConfigError, match="kv_heads"):
        shape_from_numbers(layers=2, hidden=8, intermediate=8, heads=4, vocab=10, kv_heads=3)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        plan_memory(TINY, RunShape(gpu_memory_utilization=1.5), GIB)


def test_numbers_give_the_preset_count():
    shape = shape_from_numbers(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256)
    assert shape.num_params == LLAMA8.num_params == 8_030_261_248


# ---- run config -> plan, pre-flight ---------------------------------------------------------------
@pytest.fixture
def smol_config(tmp_path):
    """A model folder holding only SmolLM2-135M's config.json (the planner reads nothing else)."""
    cfg = dict(PRESETS["smollm2-135m"], architectures=["LlamaForCausalLM"], head_dim=64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_default_cpu_config_passes_on_a_24_gib_host(smol_config):
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["memory.device_gib=24"])
    plan = preflight(cfg, smol_config, prompt_len=256)  # the longest prompt data.max_prompt_tokens allows
    assert plan.fits and plan.devices[0].used_bytes < 16 * GIB


def test_a_multi_turn_run_is_planned_for_its_whole_trajectory(smol_config):
    cfg = load_config("configs/grpo_frozenlake_cpu.yaml", ["memory.device_gib=24"])
    run = plan_for_config(cfg, smol_config, prompt_len=100).run  # the data's prompt is not the episode's first one
    assert (run.seq_len, run.response_len) == (cfg.env.max_tokens, cfg.env.max_tokens - 1)  # turns + observations
    single = load_config("configs/grpo_arith_cpu.yaml")
    run = plan_for_config(single, smol_config, prompt_len=100).run
    assert (run.seq_len, run.response_len) == (100 + single.rollout.max_new_tokens, single.rollout.max_new_tokens)


def test_preflight_refuses_an_impossible_config_with_the_table(smol_config):
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["memory.device_gib=0.01"])
    with pytest.raises(MemoryPlanError) as err:
        preflight(cfg, smol_config)
    assert "DOES NOT FIT" in str(err.value) and "trainer" in str(err.value) and "--force" in str(err.value)


def test_force_starts_anyway_with_a_warning(smol_config, capsys):
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["memory.device_gib=0.01", "memory.force=true"])
    assert not preflight(cfg, smol_config).fits
    assert "DOES NOT FIT" in capsys.readouterr().err


def test_gpu_fractions_decide_colocation(smol_config):
    cfg = load_config("configs/grpo_arith_cpu.yaml", [
        "placement.resource=GPU", "memory.device_gib=80", "algo.kl_coef=0.1", "placement.trainer_per_worker=0.5",
        "placement.rollout_per_worker=0.5", "placement.reference_per_worker=0.25"])
    plan = plan_for_config(cfg, smol_config)
    assert plan.run.colocated == ("rollout",)
    assert [d.roles for d in plan.devices] == [["trainer", "rollout"], ["reference"]]


def test_fast_path_archs_match_the_trainer():
    from actors.model.forward import FAST_PATH_ARCHS as trainer_archs

    assert FAST_PATH_ARCHS == trainer_archs


def test_negative_device_gib_is_a_config_error():
    with pytest.raises(ConfigError, match="memory.device_gib"):
        load_config("configs/grpo_arith_cpu.yaml", ["memory.device_gib=-1"])


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_layer_activation_bytes_match_saved_tensors_of_a_live_tiny_llama(precision, attention):
    """Saved-for-backward bytes per token of one layer: (forward with 3 layers - with 1 layer) / 2 / tokens,
    parameters and autocast's weight copies left out (they are counted apart, as model states)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from actors.model.forward import collate, forward_logprobs

    hf = dict(vocab_size=100, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
              tie_word_embeddings=True)
    weight_shapes = {(64, 64), (32, 64), (160, 64), (64, 160), (100, 64)}

    def saved_bytes(layers: int) -> int:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**hf, num_hidden_layers=layers, attn_implementation=attention))
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params and not (t.dim() == 2 and tuple(t.shape) in weight_shapes):
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        mb = collate([[1] * 20, [2] * 20], [[3] * 20, [4] * 12])  # 2 x 40 tokens, padded
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            forward_logprobs(model, mb, 1.0, precision)
        return sum(seen.values())

    measured = (saved_bytes(3) - saved_bytes(1)) / 2 / 80
    shape = shape_from_numbers(layers=1, hidden=64, intermediate=160, heads=4, kv_heads=2, vocab=100, tied=True)
    assert layer_activation_bytes(shape, precision, attention, 40) == pytest.approx(measured, rel=0.05)
