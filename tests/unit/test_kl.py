"""Unit tests of orchestrator.algo.kl (Schulman 2020 k1/k2/k3 estimators)."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.algo import kl_penalty

LOG2 = math.log(2.0)


def test_hand_values() -> None:
    logp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[LOG2, -1.0]])  # ref twice as likely on token 0; equal on token 1
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[-0.693147, 0.0]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[0.240227, 0.0]]))
    # k3 = exp(log 2) - log 2 - 1 = 0.306853
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([[0.306853, 0.0]]))
    torch.testing.assert_close(kl_penalty(logp, ref), kl_penalty(logp, ref, "k3"))


def test_k3_is_unbiased_estimate_of_kl() -> None:
    # Sampling from p, mean of k1 and k3 approaches KL(p || q); k3 is never negative.
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    exact = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, logq = p.log()[samples][None], q.log()[samples][None]
    k3 = kl_penalty(logp, logq, "k3")
    assert (k3 >= 0).all()
    assert float(k3.mean()) == pytest.approx(exact, abs=5e-3)
    assert float(kl_penalty(logp, logq, "k1").mean()) == pytest.approx(exact, abs=5e-3)


def test_k3_clamps_log_ratio_for_stability() -> None:
    logp = torch.tensor([[-200.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -200.0]])
    kl = kl_penalty(logp, ref, "k3")
    assert torch.isfinite(kl).all()
    torch.testing.assert_close(kl.detach(), torch.tensor([[math.exp(20.0) - 21.0, math.exp(-20.0) + 19.0]]))
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"k1.*k2.*k3"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3))
