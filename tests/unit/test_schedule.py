"""Unit tests of orchestrator.algo.schedule, including case C09 (resume restores the lr schedule)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from orchestrator.algo import lr_multiplier

C09 = functools.partial(lr_multiplier, warmup_steps=10, total_steps=100)


def test_hand_values() -> None:
    assert C09(0) == 0.0
    assert C09(1) == pytest.approx(0.1)
    assert C09(5) == pytest.approx(0.5)
    assert C09(10) == 1.0
    assert C09(55) == pytest.approx(0.5)  # progress 0.5
    assert C09(100) == 0.0
    assert C09(150) == 0.0
    assert lr_multiplier(55, warmup_steps=10, total_steps=100, min_lr_ratio=0.2) == pytest.approx(0.6)
    assert lr_multiplier(100, warmup_steps=10, total_steps=100, min_lr_ratio=0.2) == pytest.approx(0.2)
    assert lr_multiplier(0, warmup_steps=0, total_steps=10) == 1.0


def test_c09_values() -> None:
    assert 1e-6 * C09(50) == pytest.approx(5.868241e-7, abs=1e-13)
    assert 1e-6 * C09(51) == pytest.approx(5.695866e-7, abs=1e-13)
    assert 1e-6 * C09(50) == pytest.approx(1e-6 * 0.5 * (1 + math.cos(math.pi * 40 / 90)))


def _make(peak: float = 1e-6) -> tuple[torch.optim.Optimizer, LambdaLR]:
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([param], lr=peak)
    return opt, LambdaLR(opt, C09)


def _train(opt: torch.optim.Optimizer, sched: LambdaLR, steps: int) -> list[float]:
    used = []
    for _ in range(steps):
        used.append(opt.param_groups[0]["lr"])
        opt.param_groups[0]["params"][0].grad = torch.ones(2)
        opt.step()
        sched.step()
    return used


def test_c09_resume_with_lambdalr_restores_lr() -> None:
    opt, sched = _make()
    used = _train(opt, sched, 50)
    assert used[:2] == [0.0, pytest.approx(1e-7)]
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}

    opt2, sched2 = _make()
    opt2.load_state_dict(state["optimizer"])
    sched2.load_state_dict(state["scheduler"])
    resumed = _train(opt2, sched2, 2)
    assert resumed == [pytest.approx(5.868241e-7, abs=1e-13), pytest.approx(5.695866e-7, abs=1e-13)]
    # The fault: restarting the warmup.
    assert resumed[0] not in (0.0, pytest.approx(1e-7))
    # Uninterrupted training uses the same rates.
    assert _train(opt, sched, 2) == resumed


@pytest.mark.parametrize(
    ("step", "kwargs", "match"),
    [
        (-1, {"warmup_steps": 1, "total_steps": 2}, "step"),
        (0, {"warmup_steps": -1, "total_steps": 2}, "warmup_steps"),
        (0, {"warmup_steps": 5, "total_steps": 2}, "total_steps"),
        (0, {"warmup_steps": 0, "total_steps": 0}, "total_steps"),
        (0, {"warmup_steps": 1, "total_steps": 2, "min_lr_ratio": 1.5}, "min_lr_ratio"),
    ],
)
def test_errors(step: int, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        lr_multiplier(step, **kwargs)
