"""The algorithm seam's core: registries, [B, T] advantages, LossInputs / compute_policy_loss, TrainBatch."""
from __future__ import annotations

import pytest
import torch

from orchestrator.algo import (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, AdvantageConfig, AdvantageInputs, LossConfig,
                               LossInputs, TrainBatch, compute_advantages, compute_policy_loss,
                               compute_token_advantages, policy_loss, register_advantage_estimator,
                               response_mask_tensor, sequence_abs_mean, token_rows)
from orchestrator.algo.registry import Registry
from orchestrator.config.schema import CHOICES


def test_config_choices_are_the_registries_names() -> None:
    assert CHOICES["algo.estimator"] == ADVANTAGE_ESTIMATORS.names() == ("grpo", "rloo", "dr_grpo", "reinforce_plus_plus",
                                                                         "reinforce_plus_plus_baseline")
    assert CHOICES["algo.policy_loss"] == POLICY_LOSSES.names() == ("ppo_clip", "gspo", "gspo_token", "cispo")


def test_registry_errors_name_the_key_and_list_the_names() -> None:
    def one() -> int:
        return 1

    def two() -> int:
        return 2

    reg = Registry("thing", "algo.thing")
    reg.register("a")(one)
    with pytest.raises(ValueError, match=r"algo.thing: unknown thing 'b'; allowed: \['a'\]"):
        reg.get("b")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(two)
    reg.register("a")(one)  # the same function again (a module imported twice) is fine
    with pytest.raises(ValueError, match="non-empty"):
        reg.register("")


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "dr_grpo"])
def test_token_advantages_repeat_the_sequence_value_bit_for_bit(estimator: str) -> None:
    rewards = torch.tensor([0.1, 0.7, 0.3, 0.3, 0.9, 0.2])
    ids = torch.tensor([4, 4, 9, 9, 4, 7])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = compute_token_advantages(estimator, AdvantageInputs(rewards, ids, mask), AdvantageConfig(adv_eps=1e-6))
    per_seq = compute_advantages(rewards, ids, estimator, 1e-6)
    assert adv.shape == (6, 4) and adv.dtype == torch.float32
    assert torch.equal(adv, torch.where(mask.bool(), per_seq[:, None].expand(6, 4), torch.zeros(())))
    assert torch.equal(adv[2:4], torch.zeros(2, 4)) and torch.equal(adv[5], torch.zeros(4))  # uniform, singleton
    assert sequence_abs_mean(adv, mask) == float(per_seq.abs().mean())  # actor/advantage_abs_mean unchanged


def test_advantage_inputs_and_estimator_output_are_checked() -> None:
    with pytest.raises(ValueError, match="response_mask"):
        AdvantageInputs(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(3, 4))
    with pytest.raises(ValueError, match="token_rewards"):
        AdvantageInputs(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 4), token_rewards=torch.ones(2))

    @register_advantage_estimator("_bad_shape_for_test")
    def bad(inputs, cfg):
        return inputs.rewards

    try:
        with pytest.raises(ValueError, match=r"algo.estimator='_bad_shape_for_test' returned shape \(2,\)"):
            compute_token_advantages("_bad_shape_for_test", AdvantageInputs(
                torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 3)), AdvantageConfig())
    finally:
        ADVANTAGE_ESTIMATORS.unregister("_bad_shape_for_test")
    with pytest.raises(ValueError, match=r"algo.estimator: unknown advantage estimator 'gae'.*'grpo'"):
        compute_token_advantages("gae", AdvantageInputs(torch.zeros(1), torch.zeros(1, dtype=torch.long),
                                                        torch.ones(1, 1)), AdvantageConfig())


def test_compute_policy_loss_equals_the_keyword_wrapper_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(5)
    lp0 = torch.randn(3, 5, generator=g) - 2
    old, ref, roll = (lp0 + 0.3 * torch.randn(3, 5, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    adv = torch.tensor([0.5, -1.0, 2.0])
    kw = dict(clip_low=0.2, clip_high=0.28, loss_agg="seq-mean-token-mean", kl_coef=0.05, kl_estimator="k3",
              tis_cap=2.0)
    a = lp0.clone().requires_grad_(True)
    la, ma = policy_loss(a, old, adv, mask, normalizer=3.0, ref_logprobs=ref, rollout_logprobs=roll, **kw)
    la.backward()
    b = lp0.clone().requires_grad_(True)
    per_token = torch.where(mask.bool(), adv[:, None].expand(3, 5), torch.zeros(()))
    lb, mb = compute_policy_loss(LossInputs(b, old, per_token, mask, 3.0, None, ref, roll), LossConfig(**kw))
    lb.backward()
    assert torch.equal(la, lb) and torch.equal(a.grad, b.grad) and ma == mb


def test_loss_inputs_and_config_are_checked() -> None:
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        LossInputs(z, z, torch.zeros(2), z, 1.0)
    with pytest.raises(ValueError, match="normalizer"):
        LossInputs(z, z, z, z, 0.0)
    with pytest.raises(ValueError, match=r"algo.policy_loss: unknown policy loss 'no_such_loss'.*'ppo_clip'"):
        compute_policy_loss(LossInputs(z, z, z, z, 1.0), LossConfig(policy_loss="no_such_loss"))
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss(LossInputs(z, z, z, z, 1.0), LossConfig(kl_coef=0.1))
    # tis_cap without rollout logprobs: no correction (the trainer passes them only when it applies)
    _, m = compute_policy_loss(LossInputs(z, z, z, torch.ones(2, 3), 1.0), LossConfig(tis_cap=2.0))
    assert "actor/tis_weight_mean" not in m


def test_train_batch_checks_lengths_and_converts() -> None:
    b = TrainBatch.with_sequence_advantages([[1, 2], [3]], [[4, 5, 6], [7]], [[-1.0] * 3, [-2.0]], [0.5, -1.0],
                                            response_mask=[[1, 0, 1], [1]])
    assert len(b) == 2 and b.advantages == [[0.5, 0.0, 0.5], [-1.0]]
    with pytest.raises(ValueError, match=r"TrainBatch.rollout_logprobs\[1\]: 2 values for 1 response tokens"):
        TrainBatch([[1], [2]], [[3], [4]], [[0.0], [0.0, 0.0]], [[0.0], [0.0]])
    with pytest.raises(ValueError, match="TrainBatch.advantages: 1 samples"):
        TrainBatch([[1], [2]], [[3], [4]], [[0.0], [0.0]], [[0.0]])
    mask = response_mask_tensor(b.response_ids, b.response_mask)
    assert mask.tolist() == [[True, False, True], [True, False, False]]
    assert token_rows(torch.arange(6.0).reshape(2, 3), b.response_ids) == [[0.0, 1.0, 2.0], [3.0]]
    assert response_mask_tensor([[]]).shape == (1, 1)
