"""The micro-batch and data-parallel invariance sweep (test_loss.py's, for ppo_clip) over every issue-19 loss:
GSPO, GSPO-token, CISPO, dual-clip PPO and the entropy bonus. Split into D data-parallel shards (gradients
averaged) and micro-batches (gradients accumulated), each gives the un-split batch's loss and gradient; and
the Trainer's update does not depend on the micro-batch size, packing or the shared-prompt forward."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from orchestrator.algo import LossConfig, LossInputs, TrainBatch, compute_policy_loss, loss_normalizer
from orchestrator.algo import token_entropy, token_logprobs
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import save_tiny_llama

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
B, T, V, H = 8, 6, 11, 5
CASES = {
    "gspo": dict(policy_loss="gspo", gspo_clip_low=0.05, gspo_clip_high=0.05),
    "gspo_token": dict(policy_loss="gspo_token", gspo_clip_low=0.05, gspo_clip_high=0.05),
    "cispo": dict(policy_loss="cispo", cispo_clip_low=0.3, cispo_clip_high=0.28),
    "ppo_clip_dual": dict(policy_loss="ppo_clip", dual_clip_c=1.5),
    "entropy_bonus": dict(policy_loss="ppo_clip", entropy_coef=0.05, dual_clip_c=3.0),
    "gspo_entropy_tis_kl": dict(policy_loss="gspo", entropy_coef=0.05, kl_coef=0.1, tis_cap=1.5),
}


def _data() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(4321)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # an empty and a full response
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    mask[7] = torch.tensor([0, 0, 1, 1, 1, 1])
    return {"features": torch.randn(B, T, H, generator=gen), "tokens": torch.randint(0, V, (B, T), generator=gen),
            "mask": mask, "advantages": torch.randn(B, T, generator=gen),
            "old_noise": torch.randn(B, T, generator=gen) * 0.6,
            "ref": torch.randn(B, T, generator=gen) * 0.5 - 2.0, "rollout_noise": torch.randn(B, T, generator=gen) * 0.5}


def _loss(layer, data, rows, cfg, normalizer) -> tuple[torch.Tensor, dict]:
    logits = layer(data["features"][rows])
    lp = token_logprobs(logits, data["tokens"][rows], temperature=0.7)
    ent = token_entropy(logits, 0.7, grad=True)
    old = lp.detach() + data["old_noise"][rows]
    inputs = LossInputs(lp, old, data["advantages"][rows], data["mask"][rows], normalizer, T,
                        ref_logprobs=data["ref"][rows], rollout_logprobs=old + data["rollout_noise"][rows],
                        entropy=ent)
    return compute_policy_loss(inputs, cfg)


def _split(layer, data, cfg, dp: int, micro: int) -> tuple[float, torch.Tensor]:
    n = loss_normalizer(data["mask"], cfg.loss_agg, max_response_len=T, dp_size=dp)
    total, grad = 0.0, torch.zeros(sum(p.numel() for p in layer.parameters()))
    for shard in torch.arange(B).tensor_split(dp):
        layer.zero_grad(set_to_none=False)
        for rows in shard.tensor_split(micro):  # uneven and empty micro-batches included
            loss, _ = _loss(layer, data, rows, cfg, n)
            loss.backward()
            total += loss.item() / dp
        grad += torch.cat([p.grad.flatten() for p in layer.parameters()]) / dp
    return total, grad


@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_equals_unsplit_for_every_new_loss(case: str, agg: str) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(H, V)
    data = _data()
    cfg = LossConfig(loss_agg=agg, **CASES[case])
    whole, whole_grad = _split(layer, data, cfg, 1, 1)
    assert whole_grad.abs().max() > 1e-3
    _, m = _loss(layer, data, torch.arange(B), cfg, 1.0)
    assert 0 < m["actor/clip_frac"] < 1, case  # both sides of the clip are exercised
    if "dual" in case:
        assert m["actor/clip_frac_dual"] > 0
    for dp in (1, 2, 4):
        for micro in (1, 2, 4, 8):
            loss, grad = _split(layer, data, cfg, dp, micro)
            assert loss == pytest.approx(whole, abs=1e-6), (dp, micro)
            torch.testing.assert_close(grad, whole_grad, atol=1e-6, rtol=0, msg=f"dp={dp} micro={micro}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


def _group_batch() -> TrainBatch:
    """4 prompts x 2 samples (the shared-prompt forward has something to share), advantages +-1."""
    prompts = [[3 + k, 10 + k, 20 + k][: 2 + k % 2] for k in range(4) for _ in range(2)]
    responses = [[30 + i, 40 + i, 50 + i][: 1 + i % 3] for i in range(8)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses],
                                               [1.0 if i % 3 else -1.0 for i in range(8)], ref_logprobs=None)


def _step(tiny, algo: dict, **trainer) -> dict[str, float]:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "num_threads": 1, "precision": "fp32", **trainer})
    ac = OmegaConf.structured(AlgoConfig)
    ac.update(algo)
    return Trainer(str(tiny), tc, ac, temperature=1.0, max_new_tokens=8).train_step(_group_batch())


@pytest.mark.parametrize("algo", [{"policy_loss": "gspo"},
                                  {"policy_loss": "cispo"}, {"policy_loss": "ppo_clip", "entropy_coef": 0.05}],
                         ids=lambda a: "-".join(str(v) for v in a.values()))
def test_trainer_update_is_invariant_to_micro_batches_packing_and_shared_prefix(tiny, algo: dict) -> None:
    ref = _step(tiny, algo, micro_batch_size=8, shared_prefix=False)
    assert ref["actor/entropy"] > 0 and "actor/approx_kl_old" in ref and "actor/clip_frac_high" in ref
    for over in ({"micro_batch_size": 1, "shared_prefix": False}, {"micro_batch_size": 3, "shared_prefix": True},
                 {"packing": True, "micro_batch_tokens": 9, "shared_prefix": False}):
        got = _step(tiny, algo, **over)
        for key in ("actor/loss", "actor/grad_norm", "actor/entropy", "actor/approx_kl_old", "actor/ratio_mean"):
            assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (over, key)


def test_default_dual_clip_leaves_the_trainer_update_bit_identical_while_ratios_stay_below_c(tiny) -> None:
    weights = []
    for algo in ({}, {"dual_clip_c": None}):  # the default (c = 3) and off
        tc = OmegaConf.structured(TrainerConfig)
        tc.update({"lr": 5e-3, "warmup_steps": 0, "num_threads": 1, "precision": "fp32", "mini_batches": 2})
        ac = OmegaConf.structured(AlgoConfig)
        ac.update(algo)
        t = Trainer(str(tiny), tc, ac, temperature=1.0, max_new_tokens=8)
        m = t.train_step(_group_batch())
        assert m["actor/clip_frac_dual"] == 0.0 and m["actor/approx_kl_old"] > 0  # the 2nd mini-batch moved
        weights.append(t.model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
