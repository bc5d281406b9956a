"""actor/update_ratio (actors/trainer/update_size.py): ||delta theta|| / ||theta_old|| of the AdamW step just taken,
recomputed from the optimizer state, equals the one measured with a copy of the weights."""
from __future__ import annotations

import math

import pytest
import torch

from actors.trainer.update_size import update_ratio


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _measured(model, opt, steps: int) -> list[tuple[float, float]]:
    """(measured with a copy, recomputed) per step."""
    out = []
    for step in range(steps):
        x = torch.randn(8, 16)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        delta = math.sqrt(sum(float(((p - b) ** 2).sum()) for p, b in zip(model.parameters(), before)))
        norm = math.sqrt(sum(float((b ** 2).sum()) for b in before))
        out.append((delta / norm, update_ratio(opt)))
    return out


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("lr", [1e-3, 0.5])
def test_recomputed_update_ratio_equals_the_measured_one(fused, wd, lr):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, fused=fused)
    for measured, recomputed in _measured(model, opt, 4):
        assert recomputed == pytest.approx(measured, rel=1e-4)


def test_a_learning_rate_typo_shows_at_the_first_update():
    """AdamW's first step moves each weight by lr (m_hat / sqrt(v_hat) = +-1): the ratio is lr sqrt(N) / ||theta_old||
    = lr / RMS(theta_old)."""
    ratios = {}
    for lr in (2e-5, 0.5):
        model = _model()
        params = list(model.parameters())
        n, norm = sum(p.numel() for p in params), math.sqrt(sum(float((p ** 2).sum()) for p in params))
        ratios[lr] = _measured(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0), 1)[0][1]
        assert ratios[lr] == pytest.approx(lr * math.sqrt(n) / norm, rel=1e-3)
    assert ratios[2e-5] < 1e-3 and ratios[0.5] > 2.0


def test_several_groups_and_ranks_sum_their_squares():
    model = _model()
    first, second = list(model[0].parameters()), list(model[2].parameters())
    opt = torch.optim.AdamW([{"params": first, "lr": 1e-2}, {"params": second, "lr": 1e-3}], weight_decay=0.0)
    measured, recomputed = _measured(model, opt, 2)[-1]
    assert recomputed == pytest.approx(measured, rel=1e-4)
    # two ranks holding equal shards: the sums double on both sides, the ratio stays
    assert update_ratio(opt, lambda s: {k: 2 * v for k, v in s.items()}) == pytest.approx(recomputed, rel=1e-9)


def test_other_optimizers_and_no_state():
    model = _model()
    assert update_ratio(torch.optim.SGD(model.parameters(), lr=0.1)) is None
    assert update_ratio(torch.optim.AdamW(model.parameters(), amsgrad=True)) is None
    assert update_ratio(torch.optim.AdamW(model.parameters())) == 0.0  # before any step: no update
