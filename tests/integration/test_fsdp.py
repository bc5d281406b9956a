"""FSDP2 data-parallel trainer (trainer.num_workers = D, actors/trainer/sharded.py) on Ray, CPU, gloo, D = 2.

- One update of D = 2 ranks equals one update of a single trainer on the same global batch (every
  parameter, fp32, tight tolerance), with one and with two mini-batches (old logprobs sharded too).
- A GRPO run with trainer.num_workers=2 (GSPO with the entropy bonus: its row metrics) trains, syncs the engines (verified checksums, matching
  logprobs), writes a sharded checkpoint and restores from it exactly through the controller's resume
  path (weights and optimizer state equal to the saved ones); the checkpoint also resumes a single
  trainer, and a single trainer's checkpoint resumes the two ranks.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import ray
import torch
from omegaconf import OmegaConf

from actors.trainer.sharded import SHARDED_DIR, ShardedTrainerActor
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.config import load_config
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from orchestrator.controller import GRPOController
from orchestrator.rollout import PromptRequest
from orchestrator.weight_sync import compare_checksums
from tests.integration.conftest import tiny_overrides
from tests.integration.helpers import assert_loss_metrics

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _batch(n: int = 8, seed: int = 0) -> TrainBatch:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    responses = [[rng.randrange(3, 500) for _ in range(rng.randint(1, 7))] for _ in range(n)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses],
                                               [rng.choice([-1.0, 0.5, 1.0]) for _ in range(n)], ref_logprobs=None)


def _cfgs(**over):
    tc = OmegaConf.structured(TrainerConfig)
    # shared_prefix off: D > 1 ranks take the plain forward, so the single trainer does too (like for like;
    # the shared-prompt path regroups micro-batches, and AdamW's first step amplifies float-order noise
    # where |gradient| ~ eps: 2 of 6.3M weights off by 8e-6 with it on)
    tc.update({"lr": 1e-3, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32",
               "grad_clip": 0.5, "shared_prefix": False, **over})
    return tc, OmegaConf.structured(AlgoConfig)


def _ranks(model, tc, algo, d: int = 2, num_gpus: int = 0) -> list:
    group = f"test-{random.getrandbits(40):x}"
    ranks = [ShardedTrainerActor.options(num_cpus=0.5, num_gpus=num_gpus).remote(
        str(model), tc, algo, 1.0, 8, 0, rank=r, world_size=d, group_name=group, timeout_s=120.0) for r in range(d)]
    ray.get([r.ready.remote() for r in ranks])
    ray.get(ranks[0].set_peers.remote(ranks[1:]))
    return ranks


def assert_same_sync_weights(rank, single: Trainer, rtol: float, atol: float) -> None:
    """Rank 0's full weights for the sync equal `single`'s, name by name, within rtol / atol."""
    named, _ = ray.get(rank.weights_for_sync.options(num_returns=2).remote("float32"))
    ours, _ = single.weights_for_sync("float32")
    assert [n for n, _ in named] == [n for n, _ in ours]
    for (name, a), (_, b) in zip(named, ours):
        torch.testing.assert_close(a, b.cpu(), rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _plain_optimizer_state(trainer: Trainer) -> dict:
    """A single trainer's AdamW state keyed by parameter name, as ShardedTrainer.optimizer_state gives it."""
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    return {names[i]: st for i, st in trainer.optimizer.state_dict()["state"].items()}


def _assert_same_optimizer_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name, st in a.items():
        assert st.keys() == b[name].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(st[k], b[name][k]) for k in st), name


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_two_ranks_give_the_same_update_as_one(ray_local, tiny_model, tmp_path, mini_batches):
    tc, algo = _cfgs(mini_batches=mini_batches)
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=8)
    ranks = _ranks(tiny_model, tc, algo)
    try:
        batch = _batch()
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        for key in ("actor/loss", "actor/grad_norm", "actor/ratio_mean", "actor/clip_frac", "rollout/mismatch_kl_k1",
                    "rollout/mismatch_kl_k3", "rollout/mismatch_ratio_max", "rollout/mismatch_ratio_min"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        ours, _ = single.weights_for_sync("float32")
        assert [n for n, _ in named] == [n for n, _ in ours]  # every parameter (a tied head is the embedding)
        initial = dict(Trainer(str(tiny_model), tc, algo, 1.0, 8).weights_for_sync("float32")[0])
        moved = 0
        for (name, a), (_, b) in zip(named, ours):
            # atol: AdamW's step lr * m / (sqrt(v) + eps) amplifies float-order noise where |g| ~ eps (the
            # fused kernel: 1 of 6.3M weights 2.9e-7 apart); a wrong update would be off by ~lr = 1e-3
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
            moved += not torch.equal(b, initial[name])
        assert moved == len(ours)  # the update changed every tensor, so the comparison is not vacuous
        assert ray.get(ranks[0].get_step.remote()) == mini_batches == ray.get(ranks[1].get_step.remote())
        # a single trainer's checkpoint (no sharded/) loads into the ranks exactly (D = 1 -> D = 2 resume)
        single.train_step(_batch(seed=1))
        single.save_checkpoint(str(tmp_path / "single"), {"step": 2})
        ray.get(ranks[0].load_checkpoint.remote(str(tmp_path / "single")))
        named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(named, single.weights_for_sync("float32")[0]))
        sharded_state = ray.get(ranks[0].optimizer_state.remote())["state"]
        _assert_same_optimizer_state(sharded_state, _plain_optimizer_state(single))
        assert ray.get(ranks[1].get_step.remote()) == single.step
    finally:
        for r in ranks:
            ray.kill(r)


def _grpo_cfg(tiny_model, out: Path, *extra):
    over = tiny_overrides(tiny_model, out, **{"trainer.num_workers": 2, "trainer.num_threads": 1,
                                               "placement.trainer_per_worker": 0.25,
                                               "placement.rollout_per_worker": 0.5})
    return load_config("configs/grpo_arith_cpu.yaml", over + [REWARD, *extra])


def _snapshot(trainer) -> tuple[dict, dict]:
    named, _ = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
    return dict(named), ray.get(trainer.optimizer_state.remote())


def test_grpo_with_two_ranks_syncs_checkpoints_sharded_and_restores_exactly(ray_local, tiny_model, tmp_path):
    # GSPO with the entropy bonus (issue 19's losses run through the sharded trainer: every row reports their metrics)
    controller = GRPOController(_grpo_cfg(tiny_model, tmp_path, "checkpoint.every_steps=2", "algo.policy_loss=gspo",
                                          "algo.entropy_coef=0.01"))
    try:
        result = controller.run()
        actors = controller.actors
        trainer, worker = actors.trainer, actors.rollout[0]
        assert len(actors.trainer_ranks) == 2 and all(r in actors.all for r in actors.trainer_ranks)
        _, meta = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        engine = ray.get(worker.checksums.remote())
        assert engine["version"] == 2
        compare_checksums(meta["groups"], engine["groups"], where="rollout worker 0")
        # the engine samples from the sharded trainer's policy: its logprobs match the trainer's (C03)
        trajs, _ = ray.get(worker.generate.remote([PromptRequest(group_id=0, prompt_ids=[1, 2, 3, 4, 5], answer="")]))
        ours = ray.get(trainer.logprobs.remote([t.prompt_ids for t in trajs], [t.response_ids for t in trajs]))
        assert all(max(abs(a - b) for a, b in zip(t.logprobs, lp)) < 2e-3 for t, lp in zip(trajs, ours))
        weights, optim = _snapshot(trainer)
        # one more update moves weights and optimizer state away from the checkpoint ...
        ray.get(trainer.train_step.remote(_batch()))
        moved, _ = _snapshot(trainer)
        assert any(not torch.equal(moved[k], weights[k]) for k in weights)
        # ... and the controller's resume path (every rank loads `sharded/`, the engines are synced and
        # verified against the restored weights) brings back exactly the saved state
        controller.restore(Path(result.checkpoint))
        w2, o2 = _snapshot(trainer)
        assert controller.start_step == 2 and ray.get(trainer.get_step.remote()) == 2
        assert ray.get(worker.checksums.remote())["version"] == 2
    finally:
        controller.shutdown()
    ckpt = Path(result.checkpoint)
    assert ckpt.name == "step_000002"
    assert sorted(p.name for p in (ckpt / SHARDED_DIR).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not [p for p in ckpt.parent.iterdir() if ".tmp-" in p.name]  # the temporary folder was renamed
    assert [r["step"] for r in result.rows] == [1, 2]
    assert_loss_metrics(result.rows)
    # policy/ (engines restart from it on resume) holds the trained weights
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype=torch.float32).state_dict()
    assert all(torch.equal(policy[name], t) for name, t in weights.items())
    assert w2.keys() == weights.keys() and all(torch.equal(w2[k], weights[k]) for k in weights)
    assert o2["param_groups"] == optim["param_groups"]
    assert len(optim["state"]) == len(weights)  # every parameter has AdamW state (the tied head is the embedding)
    _assert_same_optimizer_state(o2["state"], optim["state"])
    # a single trainer resumes from the sharded checkpoint too (D = 2 -> D = 1)
    tc, algo = _cfgs()
    single = Trainer(str(tiny_model), tc, algo, temperature=1.0, max_new_tokens=12)
    assert single.load_checkpoint(str(ckpt))["step"] == 2 and single.step == 2
    assert all(torch.equal(t, weights[k]) for k, t in single.weights_for_sync("float32")[0])
    _assert_same_optimizer_state(_plain_optimizer_state(single), optim["state"])
