"""GAE (Schulman et al. 2016, eq. 16) and PPO's clipped value loss: hand-computed values."""
from types import SimpleNamespace

import pytest
import torch

from orchestrator.algo import AdvantageInputs, compute_token_advantages
from orchestrator.algo.gae import gae_advantages_returns, masked_whiten, token_level_rewards
from orchestrator.algo.loss_parts import loss_normalizer
from orchestrator.algo.value_loss import clipped_value_loss, explained_variance

# 3 steps, gamma = 0.9, lambda = 0.8, r = [0, 0, 1], V = [0.5, 0.6, 0.7], V after the last step = 0 (terminal):
#   delta = [0.9*0.6 - 0.5, 0.9*0.7 - 0.6, 1 - 0.7] = [0.04, 0.03, 0.3]
#   A_2 = 0.3; A_1 = 0.03 + 0.72 * 0.3 = 0.246; A_0 = 0.04 + 0.72 * 0.246 = 0.21712
#   R = A + V = [0.71712, 0.846, 1.0]
HAND_A = [0.21712, 0.246, 0.3]
HAND_R = [0.71712, 0.846, 1.0]


def test_gae_three_steps_by_hand():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae_advantages_returns(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8)
    assert adv[0].tolist() == pytest.approx(HAND_A, abs=1e-6)
    assert ret[0].tolist() == pytest.approx(HAND_R, abs=1e-6)


def test_gae_skips_unmasked_tokens_and_padding():
    """A hole in the mask (a multi-turn observation id) and right padding are not time steps."""
    r = torch.tensor([[0.0, 9.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 9.0, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    adv, ret = gae_advantages_returns(r, v, mask, gamma=0.9, lam=0.8)
    assert adv[0, [0, 2, 3]].tolist() == pytest.approx(HAND_A, abs=1e-6)
    assert ret[0, [0, 2, 3]].tolist() == pytest.approx(HAND_R, abs=1e-6)
    assert adv[0, [1, 4]].tolist() == [0.0, 0.0] and ret[0, [1, 4]].tolist() == [0.0, 0.0]


def test_gamma_lambda_one_is_reward_minus_value():
    """gamma = lambda = 1 (the default): A_t = R - V_t, the returns are the sequence reward on every token."""
    r = token_level_rewards(torch.tensor([2.0]), torch.ones(1, 4))
    v = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    adv, ret = gae_advantages_returns(r, v, torch.ones(1, 4), gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([1.9, 1.8, 1.7, 1.6], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([2.0] * 4, abs=1e-6)


def test_token_level_rewards_last_token_minus_kl():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    r = token_level_rewards(torch.tensor([1.0, 0.5, 3.0]), mask)
    assert r.tolist() == [[0, 0, 1, 0], [0.5, 0, 0, 0], [0, 0, 0, 0]]
    kl = torch.full((3, 4), 0.5)
    r = token_level_rewards(torch.tensor([1.0, 0.5, 3.0]), mask, kl, kl_coef=0.1)
    assert r[0].tolist() == pytest.approx([-0.05, -0.05, 0.95, 0.0])
    with pytest.raises(ValueError, match="kl_coef"):
        token_level_rewards(torch.tensor([1.0]), torch.ones(1, 2), kl_coef=-1.0)


def test_gae_estimator_whitens_and_needs_values():
    cfg = SimpleNamespace(gamma=0.9, lam=0.8, adv_eps=1e-6)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.1, 0.0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask, values=values)
    adv = compute_token_advantages("gae", inputs, cfg)
    raw, _ = gae_advantages_returns(token_level_rewards(inputs.rewards, mask), values, mask, 0.9, 0.8)
    assert torch.allclose(adv, masked_whiten(raw, mask), atol=1e-6)
    assert float(adv[mask != 0].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv[mask != 0].std()) == pytest.approx(1.0, abs=1e-4)
    assert adv[1, 2] == 0.0
    with pytest.raises(ValueError, match="critic"):
        compute_token_advantages("gae", AdvantageInputs(torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 2)), cfg)


def test_gae_rejects_gamma_out_of_range():
    with pytest.raises(ValueError, match="algo.gamma"):
        gae_advantages_returns(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5, lam=0.9)


def test_clipped_value_loss_cases_by_hand():
    """eps = 0.2, V_old = 0.5 on three tokens:
    V=1.0, R=2: V_clip=0.7, max((1-2)^2, (0.7-2)^2) = 1.69 -> 0.845, clipped (no gradient);
    V=1.0, R=0: max(1, 0.49) = 1 -> 0.5, unclipped (gradient V - R = 1);
    V=0.6, R=2: inside the clip range, (0.6-2)^2 = 1.96 -> 0.98, unclipped (gradient -1.4).
    token-mean: 2.325 / 3 = 0.775; clip fraction 1/3."""
    v = torch.tensor([[1.0, 1.0, 0.6]], requires_grad=True)
    old, ret, mask = torch.full((1, 3), 0.5), torch.tensor([[2.0, 0.0, 2.0]]), torch.ones(1, 3)
    loss, m = clipped_value_loss(v, old, ret, mask, 0.2, "token-mean", loss_normalizer(mask, "token-mean"))
    assert float(loss.detach()) == pytest.approx(0.775, abs=1e-6)
    assert m["critic/value_loss"] == pytest.approx(0.775, abs=1e-6)
    assert m["critic/vf_clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    assert v.grad[0].tolist() == pytest.approx([0.0, 1 / 3, -1.4 / 3], abs=1e-6)


def test_value_loss_without_clip_and_masking():
    v = torch.tensor([[1.0, float("nan")]], requires_grad=True)
    old, ret, mask = torch.zeros(1, 2), torch.tensor([[3.0, 0.0]]), torch.tensor([[1, 0]])
    loss, m = clipped_value_loss(v, old, ret, mask, None, "token-mean", 1.0)
    assert float(loss.detach()) == pytest.approx(2.0) and m["critic/vf_clip_frac"] == 0.0
    loss.backward()
    assert v.grad[0].tolist() == [-2.0, 0.0]  # the masked NaN reaches neither the loss nor the gradient
    with pytest.raises(ValueError, match="value_clip"):
        clipped_value_loss(v, old, ret, mask, 0.0, "token-mean", 1.0)


def test_value_loss_micro_batches_add_up():
    torch.manual_seed(0)
    v, old, ret = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    mask = torch.rand(4, 5) > 0.3
    n = loss_normalizer(mask, "seq-mean-token-mean")
    whole, _ = clipped_value_loss(v, old, ret, mask, 0.2, "seq-mean-token-mean", n)
    parts = sum(clipped_value_loss(v[i:i + 2], old[i:i + 2], ret[i:i + 2], mask[i:i + 2], 0.2,
                                   "seq-mean-token-mean", n)[0] for i in (0, 2))
    assert float(parts) == pytest.approx(float(whole), abs=1e-6)


def test_explained_variance():
    mask = torch.ones(1, 4)
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.5), ret, mask) == pytest.approx(0.0)
    # V = R - [1, -1, 1, -1]: Var(R - V) = 1, Var(R) = 1.25 -> 1 - 0.8 = 0.2
    assert explained_variance(ret - torch.tensor([[1.0, -1.0, 1.0, -1.0]]), ret, mask) == pytest.approx(0.2)
    assert explained_variance(ret, torch.ones(1, 4), mask) == 0.0
