"""Two GRPO steps with LoRA (trainer.lora.rank=8) on Ray (local, CPU), a tiny random Llama and vLLM on CPU.

The trainer trains only adapters; every weight sync sends merged weights W + (alpha/r) B A under the base
model's names, and the engine must then hold exactly them (checksums) and sample from the trainer's
LoRA policy (logprobs). The checkpoint's policy/ is a full HF model of the merged weights, the adapter
sits beside it, and a resume continues from it. The run trains with CISPO over two mini-batches (issue 19's loss: its
row metrics checked; the losses' math is unit-tested).
"""
from __future__ import annotations

import ray
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.rollout import PromptRequest
from orchestrator.weight_sync import compare_checksums
from tests.integration.conftest import tiny_overrides
from tests.integration.helpers import assert_loss_metrics

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [
        REWARD, "trainer.lora.rank=8", "trainer.lora.alpha=16", "trainer.lr=1e-2", "checkpoint.every_steps=1",
        "algo.policy_loss=cispo", "trainer.mini_batches=2", *extra])  # issue 19's CISPO, over two mini-batches


def test_lora_run_syncs_merged_weights_and_resumes(ray_local, tiny_model, tmp_path):
    controller = GRPOController(_cfg(tiny_model, tmp_path))
    try:
        result = controller.run()
        trainer, worker = controller.actors.trainer, controller.actors.rollout[0]
        named, meta = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        merged = dict(named)
        engine = ray.get(worker.checksums.remote())
        assert engine["version"] == 2
        compare_checksums(meta["groups"], engine["groups"])  # the engine holds the merged weights
        req = PromptRequest(group_id=0, prompt_ids=[1, 2, 3, 4, 5], answer="")
        trajs, _ = ray.get(worker.generate.remote([req]))
        ours = ray.get(trainer.logprobs.remote([t.prompt_ids for t in trajs], [t.response_ids for t in trajs]))
        for t, lp in zip(trajs, ours):
            assert max(abs(a - b) for a, b in zip(t.logprobs, lp)) < 2e-3
    finally:
        controller.shutdown()
    assert_loss_metrics(result.rows, mini_batches=2)
    initial = load_file(str(tiny_model / "model.safetensors"))
    # LoRA moved exactly the adapted projections; embeddings and norms are the base model's
    changed = {k for k, v in initial.items() if k in merged and not torch.equal(v, merged[k])}
    assert changed and all(k.rsplit(".", 2)[-2].endswith("_proj") for k in changed)
    assert torch.equal(merged["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])
    policy = AutoModelForCausalLM.from_pretrained(f"{result.checkpoint}/policy", dtype=torch.float32).state_dict()
    assert all(torch.equal(policy[k], v) for k, v in merged.items())
    assert (tmp_path / "ckpt" / "step_000002" / "policy_adapter" / "adapter_config.json").is_file()

    # resume: the engine starts from policy/ (merged), the trainer from model.path + the saved adapter
    second = GRPOController(_cfg(tiny_model, tmp_path, "trainer.total_steps=3", "checkpoint.resume=latest"))
    try:
        resumed = second.run()
        assert ray.get(second.actors.trainer.get_step.remote()) == 3 * 2  # optimizer steps: two mini-batches a step
    finally:
        second.shutdown()
    assert second.start_step == 2 and resumed.rows[-1]["sync/version"] == 3
