"""Shared fixtures: a local Ray (kept from one module to the next while nothing is left in it) and a tiny random
Llama model (2 layers, hidden 128) made on the fly.

The tiny model reuses the default model's tokenizer (prepared by `make model`), so prompts render with a
real chat template and vLLM can detokenise.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import ray
import torch


# A local Ray that a module's `ray_local` left clean (no live actor, no placement group, every resource free) is
# kept for the next module that asks for `ray_local`: `ray.init` costs 5-10 s a module on 2 cores. Any other test
# (tests/conftest.py, pytest_runtest_setup) and the end of the session shut a kept Ray down, so a test that does not
# ask for `ray_local` starts without one, as before.
KEPT = {"ray": False}


def _leftovers() -> list[str]:
    """What this Ray still holds: live actors, placement groups not removed, resources in use."""
    from ray._private import state  # the GCS actor table: the public state API needs the dashboard

    held = [f"actor {a['ActorClassName']} {a['State']}" for a in state.actors().values() if a["State"] != "DEAD"]
    held += [f"placement group {pg_id} {pg['state']}" for pg_id, pg in ray.util.placement_group_table().items()
             if pg["state"] != "REMOVED"]
    total, free = ray.cluster_resources(), ray.available_resources()
    held += [f"{k}: {free.get(k, 0.0)} of {v} free" for k, v in total.items()
             if not k.startswith(("node:", "object_store_memory", "memory")) and free.get(k, 0.0) < v - 1e-6]
    return held


def ray_is_clean(timeout_s: float = 5.0) -> bool:
    """Whether this Ray holds nothing (killed actors take a moment to be reported dead)."""
    deadline = time.time() + timeout_s
    while _leftovers():
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def shut_down_kept_ray() -> None:
    """Shut down a Ray that a previous module's `ray_local` kept (no-op otherwise)."""
    if KEPT["ray"]:
        KEPT["ray"] = False
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray (2 CPUs) for the module: the one a previous module kept, else a new one. Shut down at the
    module's end, unless this fixture started it and nothing is left in it (then kept, see KEPT)."""
    ours, KEPT["ray"] = KEPT["ray"] and ray.is_initialized(), False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "WARNING"}})
        ours = True
    yield
    if ours and ray.is_initialized() and ray_is_clean():
        KEPT["ray"] = True  # the next module's ray_local reuses it; anything else shuts it down first
    else:
        ray.shutdown()


# a lost node's actors are found dead within seconds (Ray's default health check takes about 30 s)
FAST_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}


@pytest.fixture
def cluster():
    """Several raylets on this machine (ray.cluster_utils.Cluster): the head (2 CPUs, no dashboard) now; the test
    adds the nodes it needs and connects (`ray.init(address=cluster.address)`). Ray and the cluster are shut down
    at the end."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                      "_system_config": FAST_DEATH})
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchestrator.utils.models import resolve_model_path

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


def run_error(cfg, error: type):
    """Run a GRPOController on `cfg`, which must stop with `error` (shut down either way); returns (the error, the
    controller, shut down)."""
    from orchestrator.controller import GRPOController

    controller = GRPOController(cfg)
    try:
        with pytest.raises(error) as info:
            controller.run()
    finally:
        controller.shutdown()
    return info.value, controller


def run_rows(cfg) -> list[dict]:
    """Run a GRPOController on `cfg` to the end (shut down even when it fails) and return its metrics rows."""
    from orchestrator.controller import GRPOController

    controller = GRPOController(cfg)
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    return [json.loads(line) for line in open(result.metrics)]
