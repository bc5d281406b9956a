"""Hand-computed values of the issue-19 losses: GSPO, GSPO-token, CISPO, dual-clip PPO, the entropy bonus,
and the metrics every loss reports (clip sides, approximate KL to the old policy, dual-clip fraction)."""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator.algo import LossConfig, LossInputs, compute_policy_loss

SEQ = "seq-mean-token-mean"


def _gspo_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row 0: 2 tokens with ratios 2 and 8 (s = 4); row 1: 3 tokens with ratios 1, 2, 4 (s = 8^(1/3) = 2)."""
    ratios = torch.tensor([[2.0, 8.0, 1.0], [1.0, 2.0, 4.0]])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return old + ratios.log(), old, mask


def _run(name: str, lp0: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
         normalizer: float = 2.0, entropy=None, **cfg) -> tuple[float, torch.Tensor, dict]:
    lp = lp0.clone().requires_grad_(True)
    ent = entropy.clone().requires_grad_(True) if entropy is not None else None
    cfg.setdefault("loss_agg", SEQ)
    loss, m = compute_policy_loss(LossInputs(lp, old, adv, mask, normalizer, entropy=ent),
                                  LossConfig(policy_loss=name, **cfg))
    loss.backward()
    return loss.item(), lp.grad, m


WIDE_GSPO = {"gspo_clip_low": 0.9, "gspo_clip_high": 10.0}


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_sequence_ratio_on_a_2_and_a_3_token_sequence(name: str) -> None:
    lp, old, mask = _gspo_batch()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, grad, m = _run(name, lp, old, adv, mask, **WIDE_GSPO)
    # pg: row 0 -A s = -4 per token, row 1 +2; seq-mean-token-mean over 2 sequences: (-4 + 2) / 2
    assert loss == pytest.approx(-1.0, abs=1e-6)
    assert m["actor/ratio_mean"] == pytest.approx((2 * 4 + 3 * 2) / 5, abs=1e-5)  # s_i per token
    # eq. 6: d loss / d lp_t = -A_i s_i / |y_i| / N: row 0 -1 * 4 / 2 / 2 = -1, row 1 +1 * 2 / 3 / 2 = 1/3
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -1.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]), atol=1e-6, rtol=0)
    assert m["actor/clip_frac"] == 0.0


def test_gspo_clips_the_sequence_with_the_papers_range() -> None:
    lp, old, mask = _gspo_batch()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, grad, m = _run("gspo", lp, old, adv, mask)  # gspo_clip_low / high 3e-4 / 4e-4 (LossConfig's defaults)
    # row 0: A > 0, s = 4 > 1.0004: clipped, -A * 1.0004, no gradient; row 1: A < 0, s = 2: max(2, 1.0004) = 2
    assert loss == pytest.approx((-1.0004 + 2.0) / 2, abs=1e-6)
    assert torch.equal(grad[0], torch.zeros(3)) and grad[1].abs().min() > 0.3
    assert m["actor/clip_frac"] == pytest.approx(2 / 5) and m["actor/clip_frac_high"] == pytest.approx(2 / 5)
    assert m["actor/clip_frac_low"] == 0.0
    # a sequence ratio just below 1 - 3e-4 with A < 0 leaves by the low side
    lp2 = old + torch.tensor([[-1e-3, -1e-3, 0.0], [0.0, 0.0, 0.0]])
    _, _, m2 = _run("gspo", lp2, old, -adv.abs(), mask)
    assert m2["actor/clip_frac_low"] == pytest.approx(2 / 5) and m2["actor/clip_frac_high"] == 0.0


def test_gspo_token_equals_gspo_and_keeps_per_token_advantages_on_their_token() -> None:
    lp, old, mask = _gspo_batch()
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    a = _run("gspo", lp, old, adv, mask, **WIDE_GSPO)
    b = _run("gspo_token", lp, old, adv, mask, **WIDE_GSPO)
    assert a[0] == b[0] and a[2] == b[2]  # same value and metrics, bit for bit
    torch.testing.assert_close(a[1], b[1], atol=1e-7, rtol=0)  # sequence-constant advantages: same gradient
    # per-token advantages (eq. 13-14): token t's gradient is -A_t s_i / |y_i| / N, its own advantage only
    per_token = torch.tensor([[2.0, -1.0, 0.0], [0.5, 0.0, -3.0]])
    _, grad, _ = _run("gspo_token", lp, old, per_token, mask, **WIDE_GSPO)
    expected = torch.tensor([[-2.0 * 4 / 2 / 2, 1.0 * 4 / 2 / 2, 0.0], [-0.5 * 2 / 3 / 2, 0.0, 3.0 * 2 / 3 / 2]])
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=0)
    _, grad_seq, _ = _run("gspo", lp, old, per_token, mask, **WIDE_GSPO)  # gspo mixes them over the sequence
    assert not torch.allclose(grad_seq, expected, atol=1e-3)


def test_cispo_hand_values_and_no_token_leaves_the_gradient() -> None:
    old = torch.log(torch.tensor([[0.1, 0.4, 0.5]]))
    lp = torch.log(torch.tensor([[0.8, 0.2, 0.5]]))  # ratios 8, 0.5, 1
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    loss, grad, m = _run("cispo", lp, old, adv, mask, normalizer=3.0, loss_agg="token-mean")  # low null, high 0.28
    w = torch.tensor([1.28, 0.5, 1.0])
    assert loss == pytest.approx(float(-(w * adv[0] * lp[0]).sum() / 3), abs=1e-6)
    torch.testing.assert_close(grad, (-w * adv[0] / 3)[None], atol=1e-6, rtol=0)  # -w A / N, never 0
    assert m["actor/clip_frac"] == pytest.approx(1 / 3) and m["actor/clip_frac_high"] == pytest.approx(1 / 3)
    _, grad, m = _run("cispo", lp, old, adv, mask, normalizer=3.0, loss_agg="token-mean", cispo_clip_low=0.2)
    torch.testing.assert_close(grad, (-torch.tensor([1.28, 0.8, 1.0]) * adv[0] / 3)[None], atol=1e-6, rtol=0)
    assert m["actor/clip_frac_low"] == pytest.approx(1 / 3)


def test_cispo_gradient_equals_the_weighted_reinforce_gradient() -> None:
    g = torch.Generator().manual_seed(3)
    lp0 = torch.randn(4, 6, generator=g) - 2
    old = lp0 + 0.6 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).long()
    for agg in ("token-mean", SEQ):
        _, grad, _ = _run("cispo", lp0, old, adv, mask, normalizer=5.0, loss_agg=agg, cispo_clip_low=0.3)
        lp = lp0.clone().requires_grad_(True)
        w = torch.exp(lp0 - old).clamp(0.7, 1.28)  # the clipped ratio, a constant
        per_token = -w * adv * lp
        m = mask.bool()
        if agg == "token-mean":
            ref = per_token[m].sum() / 5.0
        else:
            ref = sum(per_token[i][m[i]].mean() for i in range(4) if m[i].any()) / 5.0
        ref.backward()
        torch.testing.assert_close(grad, lp.grad, atol=1e-6, rtol=0)
        assert (grad[m] != 0).all()


def test_dual_clip_bounds_a_negative_advantage_at_c_times_abs_a() -> None:
    old = torch.zeros(1, 3)
    lp = torch.log(torch.tensor([[5.0, 2.0, 5.0]]))
    adv = torch.tensor([[-2.0, -2.0, 2.0]])
    mask = torch.ones(1, 3)
    kw = dict(normalizer=1.0, loss_agg="token-mean", clip_low=0.2, clip_high=0.28)
    loss, grad, m = _run("ppo_clip", lp, old, adv, mask, dual_clip_c=3.0, **kw)
    # token 0: -A r = 10 > c |A| = 6 -> 6, no gradient; token 1: r = 2 < c: 4 as without; token 2: A > 0: -2 * 1.28
    assert loss == pytest.approx(6.0 + 4.0 - 2.56, abs=1e-5)
    assert grad[0, 0] == 0.0 and grad[0, 1] == pytest.approx(4.0, abs=1e-5) and grad[0, 2] == 0.0
    assert m["actor/clip_frac_dual"] == pytest.approx(1 / 3)
    off, _, m_off = _run("ppo_clip", lp, old, adv, mask, dual_clip_c=None, **kw)
    assert off == pytest.approx(10.0 + 4.0 - 2.56, abs=1e-5) and m_off["actor/clip_frac_dual"] == 0.0


def test_dual_clip_changes_nothing_while_every_ratio_is_at_most_c() -> None:
    g = torch.Generator().manual_seed(11)
    for _ in range(20):
        lp0 = torch.randn(5, 7, generator=g) - 2
        old = lp0 + torch.randn(5, 7, generator=g)  # ratios from ~0.05 to ~20 ...
        old = torch.maximum(old, lp0 - math.log(2.99))  # ... then every ratio < c = 3 (float rounding kept clear)
        adv, mask = torch.randn(5, 7, generator=g), (torch.rand(5, 7, generator=g) > 0.2).long()
        assert (torch.exp(lp0 - old) > 2).any()  # far from 1: the clip branches are exercised
        a = _run("ppo_clip", lp0, old, adv, mask, normalizer=4.0, dual_clip_c=3.0)
        b = _run("ppo_clip", lp0, old, adv, mask, normalizer=4.0, dual_clip_c=None)
        assert a[0] == b[0] and torch.equal(a[1], b[1]) and a[2] == b[2]


def test_clip_sides_and_approx_kl_old_hand_values() -> None:
    ratios = torch.tensor([[1.5, 1.25, 0.5, 0.5, 0.75, 1.5]])  # test_loss's clip example, clip 0.2 / 0.28
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]])
    _, _, m = _run("ppo_clip", ratios.log(), torch.zeros(1, 6), adv, torch.ones(1, 6), normalizer=6.0,
                   loss_agg="token-mean", clip_low=0.2, clip_high=0.28)
    assert m["actor/clip_frac"] == pytest.approx(3 / 6)  # tokens 0 (high side), 3 and 4 (low side)
    assert m["actor/clip_frac_high"] == pytest.approx(1 / 6) and m["actor/clip_frac_low"] == pytest.approx(2 / 6)
    k3 = [r - 1 - math.log(r) for r in (1.5, 1.25, 0.5, 0.5, 0.75, 1.5)]  # (rho - 1) - log rho, Schulman's k3
    assert m["actor/approx_kl_old"] == pytest.approx(sum(k3) / 6, abs=1e-6)
    assert m["actor/approx_kl_old"] == pytest.approx(0.106650, abs=1e-5)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token", "cispo"])
def test_entropy_bonus_is_aggregated_like_the_pg_term(name: str) -> None:
    lp, old, mask = _gspo_batch()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    ent = torch.tensor([[0.5, 1.5, 9.0], [1.0, 2.0, 3.0]])  # 9.0 sits off the mask
    base, grad0, m0 = _run(name, lp, old, adv, mask, entropy=ent, entropy_coef=0.0)
    with_bonus, grad1, m1 = _run(name, lp, old, adv, mask, entropy=ent, entropy_coef=0.1)
    # seq-mean-token-mean, N = 2: row means 1.0 and 2.0 -> (1 + 2) / 2 = 1.5
    assert with_bonus == pytest.approx(base - 0.1 * 1.5, abs=1e-6)
    torch.testing.assert_close(grad0, grad1, atol=0, rtol=0)  # the bonus acts through the entropy's graph only
    assert m0["actor/entropy"] == m1["actor/entropy"] == pytest.approx((0.5 + 1.5 + 1 + 2 + 3) / 5)
    with pytest.raises(ValueError, match="entropy: required when entropy_coef > 0"):
        _run(name, lp, old, adv, mask, entropy_coef=0.1)


def test_every_loss_reports_the_same_metric_keys() -> None:
    lp, old, mask = _gspo_batch()
    adv = torch.ones(2, 3)
    keys = {"actor/clip_frac", "actor/clip_frac_low", "actor/clip_frac_high", "actor/clip_frac_dual",
            "actor/approx_kl_old", "actor/ratio_mean", "actor/pg_loss", "actor/kl", "actor/tokens"}
    for name in ("ppo_clip", "gspo", "gspo_token", "cispo"):
        assert keys <= set(_run(name, lp, old, adv, mask)[2]), name
