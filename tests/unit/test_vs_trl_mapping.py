"""benchmarks/trl_config.py: every setting matched between our CPU config and TRL's GRPOConfig (no trl import),
and the summary math of benchmarks/vs_trl_report.py on hand-computed rows."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from orchestrator.config import load_config

REPO = Path(__file__).resolve().parents[2]
CPU_YAML = REPO / "configs" / "grpo_arith_cpu.yaml"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"vs_trl_test_{name}", REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


tc = _module("trl_config")
rep = _module("vs_trl_report")


def _settings(*overrides: str):
    return tc.matched_settings(load_config(CPU_YAML, list(overrides)))


def test_settings_read_from_the_cpu_config() -> None:
    s = _settings()
    assert (s.model_path, s.group_size, s.prompts_per_step, s.micro_batch_size) == ("default", 8, 4, 8)
    assert (s.max_new_tokens, s.temperature, s.top_p) == (48, 1.0, 1.0)
    assert (s.lr, s.betas, s.weight_decay, s.max_grad_norm) == (2e-5, (0.9, 0.99), 0.0, 1.0)
    assert (s.clip_low, s.clip_high, s.loss_type, s.scale_rewards) == (0.2, 0.28, "dapo", "group")
    assert (s.reward_names, s.reward_weights, s.seed) == (("accuracy",), (1.0,), 0)
    assert (s.max_model_len, s.engine_dtype, s.kv_cache_space_gib, s.tis_cap) == (1024, "float32", 2, 2.0)
    assert (s.global_batch, s.grad_accum) == (32, 4)


def test_trl_kwargs_match_every_setting() -> None:
    kw = tc.trl_grpo_kwargs(_settings(), "/tmp/out", steps=10)
    expected = {
        "output_dir": "/tmp/out", "max_steps": 10, "seed": 0, "use_cpu": True, "bf16": False, "fp16": False,
        "num_generations": 8, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
        "steps_per_generation": 4, "num_iterations": 1,  # 32 completions per generation, ONE optimizer step
        "max_completion_length": 48, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
        "learning_rate": 2e-5, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "adam_beta1": 0.9, "adam_beta2": 0.99, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "beta": 0.0, "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "scale_rewards": "group",
        "reward_weights": [1.0], "shuffle_dataset": False, "gradient_checkpointing": False,
        "mask_truncated_completions": False, "save_strategy": "no",
    }
    assert {k: kw[k] for k in expected} == expected
    # 4 prompts per step: the generation batch (per-device batch x steps_per_generation) holds 4 groups of 8
    assert kw["per_device_train_batch_size"] * kw["steps_per_generation"] // kw["num_generations"] == 4
    assert "use_vllm" not in kw and "generation_batch_size" not in kw  # TRL refuses both batch knobs at once


def test_trl_kwargs_vllm_mode_matches_our_tis() -> None:
    kw = tc.trl_grpo_kwargs(_settings(), "/tmp/out", use_vllm=True)
    assert (kw["use_vllm"], kw["vllm_mode"], kw["vllm_max_model_length"]) == (True, "colocate", 1024)
    # ours: per-token truncated importance weights against the engine's logprobs, cap algo.tis_cap = 2
    assert (kw["vllm_importance_sampling_mode"], kw["vllm_importance_sampling_clip_max"]) == ("token_truncate", 2.0)


def test_our_overrides_constant_lr_file_order_and_temp_outputs() -> None:
    ov = tc.our_overrides(7, "/tmp/vs/ours")
    cfg = load_config(CPU_YAML, ov)
    assert cfg.trainer.total_steps == 7
    assert (cfg.trainer.min_lr_ratio, cfg.trainer.warmup_steps) == (1.0, 0)  # constant lr 2e-5
    assert cfg.data.shuffle is False and cfg.run.progress is False
    assert cfg.run.output_dir == "/tmp/vs/ours" and cfg.checkpoint.dir == "/tmp/vs/ours/checkpoints"
    assert cfg.checkpoint.every_steps == 0
    with pytest.raises(ValueError, match="steps=0"):
        tc.our_overrides(0, "/tmp/x")


@pytest.mark.parametrize("overrides, fragment", [
    (["algo.kl_coef=0.01"], "algo.kl_coef"),
    (["algo.estimator=rloo"], "algo.estimator"),
    (["trainer.precision=bf16-autocast"], "trainer.precision"),
    (["trainer.micro_batch_size=5"], "trainer.micro_batch_size=5"),
])
def test_unmatchable_settings_are_refused(overrides, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        _settings(*overrides)


def test_other_estimators_and_loss_aggregations_map() -> None:
    s = _settings("algo.estimator=dr_grpo", "algo.loss_agg=seq-mean-token-sum-norm")
    assert (s.scale_rewards, s.loss_type) == ("none", "dr_grpo")
    assert _settings("algo.loss_agg=seq-mean-token-mean").loss_type == "grpo"


def _row(step, step_s, gen_s, train_s, comp, prompt, reward):
    return {"step": step, "step_s": step_s, "generate_s": gen_s, "train_s": train_s, "completion_tokens": comp,
            "prompt_tokens": prompt, "reward_mean": reward}


def test_report_excludes_step_one_and_takes_ratios() -> None:
    ours = {"peak_rss_bytes": 2 * 2**30, "wall_s": 100.0, "steps": [
        _row(1, 90.0, 40.0, 40.0, 960, 1000, 0.25), _row(2, 10.0, 4.0, 5.0, 800, 1000, 0.5),
        _row(3, 14.0, 6.0, 7.0, 1200, 1000, 0.75)]}
    trl = {"peak_rss_bytes": 3 * 2**30, "wall_s": 200.0, "steps": [
        _row(1, 50.0, 20.0, 30.0, 960, 1000, 0.0), _row(2, 30.0, 20.0, 10.0, 1000, 1000, 0.5),
        _row(3, 30.0, 20.0, 10.0, 1000, 1000, 0.5)]}
    o, t = rep.side_stats([ours], k=2), rep.side_stats([trl], k=2)
    assert o["s_per_step"] == 12.0 and o["step1_s"] == 90.0  # (10 + 14) / 2, step 1 left out
    assert o["gen_tokens_per_s"] == 2000 / 10.0  # (800 + 1200) / (4 + 6)
    assert o["train_tokens_per_s"] == (2000 + 2000) / 12.0
    assert o["reward_first_k"] == 0.375 and o["reward_last_k"] == 0.625
    assert t["gen_tokens_per_s"] == 2000 / 40.0
    r = rep.ratios(o, t)
    assert r["speedup_s_per_step"] == 30.0 / 12.0
    assert r["gen_tokens_per_s"] == 4.0 and r["peak_rss"] == 1.5
    assert math.isclose(r["reward_last_k_diff"], 0.125)
    assert "met" in rep.verdict(r) and "NOT" not in rep.verdict(r)
    assert "both met" in rep.verdict({**r, "reward_last_k_diff": 0.3})  # learning faster than TRL is fine
    slower_learning = rep.verdict({**r, "reward_last_k_diff": -0.3})
    assert "NOT matched" in slower_learning and slower_learning.endswith("NOT met")
    assert rep.verdict({**r, "speedup_s_per_step": 1.5}).endswith("NOT met")
    table = rep.markdown_table(o, t, r, 2, "transformers generation")
    assert "| seconds per step (mean of steps 2..N) | 12.00 | 30.00 | 2.50x faster |" in table


def test_report_refuses_a_single_step_run() -> None:
    with pytest.raises(ValueError, match="1 step"):
        rep.repeat_stats({"peak_rss_bytes": 0, "wall_s": 1.0, "steps": [_row(1, 1, 1, 1, 1, 1, 1)]}, k=1)


def test_mapping_and_report_modules_import_no_trl() -> None:
    for name in ("trl_config", "vs_trl_report"):
        text = (REPO / "benchmarks" / f"{name}.py").read_text()
        assert "import trl" not in text and "from trl" not in text and "import torch" not in text


def test_our_steps_skip_rows_that_are_not_steps() -> None:
    vs = _module("vs_trl")
    rows = [{"eval/pass_at_1": 0.5, "step": 0},  # the held-out eval's row (an asynchronous run writes one)
            {"step": 1, "timing/step_s": 12.0, "timing/checkpoint_s": 2.0, "timing/generate_s": 4.0,
             "timing/train_s": 6.0, "rollout/tokens": 900.0, "reward/mean": 0.5}]
    (only,) = vs.our_steps(rows, [300])
    assert (only["step"], only["step_s"], only["prompt_tokens"], only["reward_mean"]) == (1, 10.0, 300, 0.5)


def test_trl_side_loads_our_reward_without_the_packages_the_trl_venv_lacks() -> None:
    """benchmarks/trl_side.py runs in TRL's venv (no Ray, omegaconf, pebble): its `load_accuracy` must not import
    them (a fresh subprocess where importing them fails)."""
    import subprocess

    code = ("import sys\nfor m in ('ray', 'omegaconf', 'pebble', 'vllm'):\n    sys.modules[m] = None\n"
            "import importlib.util\nspec = importlib.util.spec_from_file_location('ts', %r)\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(m.load_accuracy()(['3 + 5 = 8.', 'no'], ['8', '8']))" % str(REPO / "benchmarks" / "trl_side.py"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.strip().splitlines()[-1] == "[1.0, 0.0]"
