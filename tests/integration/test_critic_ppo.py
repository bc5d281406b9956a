"""PPO with a value model (algo.estimator=gae) on Ray (local, CPU) with the tiny model and vLLM: two steps train
the critic beside the policy (its values move off the zero-initialised head), every checkpoint holds its
`critic/` folder under the manifest, and a resume restores its weights, optimizer and step. The resume runs the
critic sharded over two ranks (critic.num_workers=2, actors/critic_sharded.py): the single critic's checkpoint
loads into them, they train a step through rank 0's fan-out and write a sharded `critic/` folder."""
from __future__ import annotations

import json

import pytest
import ray
import torch
from safetensors.torch import load_file

from orchestrator.checkpoint import read_manifest, verify_manifest
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [
        REWARD, "algo.estimator=gae", "algo.lam=0.95", "critic.lr=1e-3", "checkpoint.every_steps=1", *extra])


def test_ppo_with_a_critic_trains_checkpoints_and_resumes(ray_local, tiny_model, tmp_path):
    first = GRPOController(_cfg(tiny_model, tmp_path))
    try:
        result = first.run()
        critic = first.actors.critic
        assert critic is not None and ray.get(critic.get_step.remote()) == 2
        trained = ray.get(critic.weights_checksum.remote())
    finally:
        first.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("critic/value_loss", "critic/vf_clip_frac", "critic/explained_var", "critic/grad_norm",
                "critic/values_mean", "critic/returns_mean", "actor/pg_loss"):
        assert all(key in r for r in rows), key
    assert rows[0]["critic/values_mean"] == 0.0  # the zero-initialised head
    assert rows[1]["critic/values_mean"] != 0.0  # one critic update later the values moved
    assert all(r["critic/skipped_updates"] == 0.0 for r in rows)

    ckpt = tmp_path / "ckpt" / "step_000002"
    files = read_manifest(ckpt)["files"]
    assert {"critic/value_model.safetensors", "critic/critic_state.pt", "policy/model.safetensors"} <= set(files)
    assert verify_manifest(ckpt) == []
    saved = sum(float(t.double().sum()) for t in load_file(ckpt / "critic" / "value_model.safetensors").values())
    assert saved == pytest.approx(trained, rel=1e-9)

    # the same command again with 2 critic ranks: resumes at step 2 (the last step), restores the critic, adds a step
    second = GRPOController(_cfg(tiny_model, tmp_path, "trainer.total_steps=3", "critic.num_workers=2",
                                 "critic.per_worker=0.25"))
    assert second.resume_from == ckpt
    try:
        second.job.start(second.resume_from)
        second.restore(second.resume_from)
        critic = second.actors.critic
        assert ray.get(critic.get_step.remote()) == 2
        assert ray.get(critic.weights_checksum.remote()) == pytest.approx(trained, rel=1e-9)
        second.start_rollouts()
        row, _ = second.step(3)
        assert ray.get(critic.get_step.remote()) == 3 and row["critic/values_mean"] != 0.0
        assert len(second.actors.critic_ranks) == 2
        sharded = tmp_path / "sharded_ckpt"
        second.job.checkpoint(sharded, {"step": 3})
        assert (sharded / "critic" / "sharded").is_dir() and verify_manifest(sharded) == []
        saved = sum(float(t.double().sum()) for t in load_file(sharded / "critic" / "value_model.safetensors").values())
        assert saved == pytest.approx(ray.get(critic.weights_checksum.remote()), rel=1e-9) and saved != trained
    finally:
        second.shutdown()
    assert torch.isfinite(torch.tensor(row["critic/value_loss"]))
