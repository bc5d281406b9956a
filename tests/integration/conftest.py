"""Shared fixtures: a local Ray and a tiny random Llama model (2 layers, hidden 128) made on the fly.

The tiny model reuses the default model's tokenizer (prepared by `make model`), so prompts render with a
real chat template and vLLM can detokenise.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch


@pytest.fixture(scope="module")
def ray_local():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING"}})
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchestrator.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def tiny_overrides(model: Path, out: Path, **extra) -> list[str]:
    """Overrides that turn the default config into a seconds-long run on the tiny model."""
    base = {"model.path": str(model), "run.output_dir": str(out), "checkpoint.dir": str(out / "ckpt"),
            "run.progress": "false", "trainer.total_steps": "2", "rollout.n": "4", "rollout.prompts_per_step": "2",
            "rollout.max_new_tokens": "12", "trainer.micro_batch_size": "3", "reward.num_workers": "1",
            "trainer.lr": "1e-3", "rollout.kv_cache_space_gib": "1",
            "eval.every_steps": "0"}  # the demo's held-out eval off: a test that wants it turns it on
    base.update({k: str(v) for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def assert_engine_holds_trainer_weights(controller, version: int):
    """The first engine reports `version` and per-group checksums equal to the trainer's weights.
    Returns (trainer handle, engine handle)."""
    from orchestrator.weight_sync import compare_checksums

    trainer, worker = controller.actors.trainer, controller.actors.rollout[0]
    _, meta_ref = trainer.weights_for_sync.options(num_returns=2).remote("float32")
    engine = ray.get(worker.checksums.remote())
    assert engine["version"] == version
    compare_checksums(ray.get(meta_ref)["groups"], engine["groups"])
    return trainer, worker


def run_rows(cfg) -> list[dict]:
    """Run a GRPOController on `cfg` to the end (shut down even when it fails) and return its metrics rows."""
    from orchestrator.controller import GRPOController

    controller = GRPOController(cfg)
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    return [json.loads(line) for line in open(result.metrics)]
