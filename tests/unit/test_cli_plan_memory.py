"""`rl-orch plan memory` and the pre-flight refusal of `rl-orch run` (no actor, no Ray)."""
import json

import pytest

from orchestrator.cli import main
from orchestrator.memory.params import PRESETS


# the published figures assume a bf16 frozen base (--frozen-dtype bf16); rl-orch's trainer holds it in fp32
def test_full_finetune_of_8b_on_24_gib_does_not_fit_and_suggests_lora(capsys):
    assert main(["plan", "memory", "--model", "llama3-8b", "--device-gib", "24", "--frozen-dtype", "bf16"]) == 1
    out = capsys.readouterr().out
    assert "trainer GPU (x1): trainer: " in out and "DOES NOT FIT" in out
    assert "trainer.lora.rank=16 (LoRA): fits" in out


def test_lora_on_8b_fits_24_gib(capsys):
    argv = ["plan", "memory", "--model", "llama3-8b", "--device-gib", "24", "--lora-rank", "16"]
    assert main(argv + ["--frozen-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" not in out and "trainer: " in out and ": fits" in out
    # rl-orch's own LoRA trainer keeps the base in fp32: not in 24 GiB, and the suggestions say which
    # of them rl-orch cannot carry out yet
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "[not in rl-orch yet: CPU offload]" in out
    # LoRA on several FSDP2 trainer ranks is carried out (actors/trainer/sharded.py): suggested unmarked
    assert "trainer.num_workers=2 (FSDP shards): " in out and "LoRA with trainer.num_workers" not in out


def test_config_mode_refuses_flags_it_would_ignore(capsys):
    argv = ["plan", "memory", "--config", "configs/grpo_arith_cpu.yaml", "--model", "llama3-8b", "--lora-rank", "8"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--model, --lora-rank would be ignored" in err and "trainer.lora.rank=16" in err


@pytest.mark.parametrize("flags,option", [(["--device-gib", "inf"], "--device-gib"),
                                          (["--cpu", "--kv-cache-gib", "-1"], "--kv-cache-gib"),
                                          (["--seq-len", "100", "--response-len", "200"], "--response-len")])
def test_out_of_range_numbers_name_the_option(capsys, flags, option):
    assert main(["plan", "memory", "--model", "llama3-8b", *flags]) == 2
    assert option in capsys.readouterr().err


def test_numbers_instead_of_a_preset(capsys):
    argv = ["plan", "memory", "--layers", "32", "--hidden", "4096", "--intermediate", "14336", "--heads", "32",
            "--kv-heads", "8", "--vocab", "128256", "--device-gib", "80", "--trainer-gpus", "8", "--grad-ckpt"]
    assert main(argv) == 0
    assert "8.03e9 parameters" in capsys.readouterr().out


@pytest.mark.parametrize("argv,option", [
    (["--layers", "2"], "--model"),
    (["--model", "nope-model"], "--model"),
    (["--model", "llama3-8b", "--device-gib", "-1"], "--device-gib"),
    (["--model", "llama3-8b", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--model", "llama3-8b", "--micro-batch-size", "0"], "--micro-batch-size"),
])
def test_bad_input_names_the_option(argv, option, capsys):
    assert main(["plan", "memory", *argv]) == 2
    assert option in capsys.readouterr().err


@pytest.fixture
def tiny_folder(tmp_path):
    """A model folder with a tiny Llama config.json and the default model's tokenizer: enough for the
    controller to render prompts and for the planner; no weights (no actor ever loads them here)."""
    from transformers import AutoTokenizer

    from orchestrator.utils.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    cfg = dict(PRESETS["smollm2-135m"], architectures=["LlamaForCausalLM"], num_hidden_layers=2, hidden_size=64,
               intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tok))
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    tok.save_pretrained(folder)
    return folder


def test_plan_memory_from_a_run_config(tiny_folder, capsys):
    argv = ["plan", "memory", "--config", "configs/grpo_arith_cpu.yaml", f"model.path={tiny_folder}",
            "--device-gib", "24"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "host (CPU run: every role): trainer + rollout" in out and "of 24.00 GiB: fits" in out


def test_run_refuses_to_start_and_prints_the_table(tiny_folder, tmp_path, capsys):
    import ray

    argv = ["run", "configs/grpo_arith_cpu.yaml", f"model.path={tiny_folder}", f"run.output_dir={tmp_path / 'out'}",
            f"checkpoint.dir={tmp_path / 'ckpt'}", "memory.device_gib=0.01"]  # not a demo's runs/ checkpoint
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("memory error: the run does not fit in memory")
    assert "role" in err and "trainer" in err and "DOES NOT FIT" in err
    assert not ray.is_initialized()  # refused before any actor (or Ray itself) started
