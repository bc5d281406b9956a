"""Generalised advantage estimation (GAE) over ``[B, T]`` response tokens: the ``gae`` estimator (PPO with a critic).

Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation", eq. 16::

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = sum_{l >= 0} (gamma * lambda)^l * delta_{t+l}      (computed backwards: A_t = delta_t + gamma*lambda*A_{t+1})
    R_t     = A_t + V_t                                           (the value target, "returns")

Over one response: t runs over the response tokens where ``response_mask`` is nonzero, in order; tokens where
it is 0 (multi-turn observation ids) are skipped (their V and r do not enter, as in verl's
``compute_gae_advantage_return``), and the state after the last response token is terminal (V = 0).
Token rewards (``token_level_rewards``): the sequence reward on the last response token, 0 elsewhere, minus
``kl_coef * kl_t`` on every response token when a per-token KL is given (PPO-RLHF's KL-in-reward, Ouyang et
al. 2022, eq. 2; the controller passes none: with ``algo.estimator=gae`` a KL to the reference goes into the
loss through ``algo.kl_coef`` as for GRPO). The advantages are then whitened over the batch's response tokens
(mean 0, std 1; verl's ``masked_whiten``); the returns are not. Pure torch; no Ray.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from orchestrator.algo.advantages import AdvantageInputs, register_advantage_estimator


def token_level_rewards(rewards: Tensor, response_mask: Tensor, kl: Optional[Tensor] = None,
                        kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards ``[B, T]`` float32: ``rewards[i]`` on sample i's last response token (the last nonzero
    of its mask), 0 elsewhere, minus ``kl_coef * kl`` on response tokens when ``kl`` ``[B, T]`` is given.

    A sample without a response token gets nothing. Raises ValueError for a negative ``kl_coef`` or a ``kl``
    not shaped like the mask.
    """
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef: must be >= 0, got {kl_coef}")
    mask = response_mask != 0
    t = mask.shape[1]
    pos = torch.arange(t, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(dim=1).values  # [B], -1 = no response token
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = last >= 0
    out[has.nonzero().flatten(), last[has]] = rewards[has].to(torch.float32)
    if kl is not None:
        if kl.shape != mask.shape:
            raise ValueError(f"kl: shape {tuple(kl.shape)} != response_mask shape {tuple(mask.shape)}")
        out = out - kl_coef * torch.where(mask, kl.to(torch.float32), torch.zeros((), device=mask.device))
    return out


def gae_advantages_returns(token_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float,
                           lam: float) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016, eq. 16) per response token, not whitened: ``(advantages, returns)``.

    Args:
        token_rewards: ``[B, T]`` float, r_t (see ``token_level_rewards``).
        values: ``[B, T]`` float, V_t: the critic's value of the state before response token t.
        response_mask: ``[B, T]``, nonzero on the response tokens; others are skipped (not a time step).
        gamma, lam: discount and GAE lambda, each in [0, 1].
    Returns:
        ``A`` and ``R = A + V``, ``[B, T]`` float32, exactly 0 off the mask. Computed in float64.
    Raises:
        ValueError: gamma or lam outside [0, 1], shapes that differ.
    """
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"algo.{name}: must be in [0, 1], got {x}")
    if not (token_rewards.shape == values.shape == response_mask.shape) or values.dim() != 2:
        raise ValueError(f"token_rewards / values / response_mask: expected equal [B, T] shapes, got "
                         f"{tuple(token_rewards.shape)} / {tuple(values.shape)} / {tuple(response_mask.shape)}")
    mask = response_mask != 0
    r, v = token_rewards.to(torch.float64), values.to(torch.float64)
    next_value = torch.zeros(v.shape[0], dtype=torch.float64, device=v.device)  # V after the last token: terminal
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(v)
    for t in reversed(range(v.shape[1])):
        m = mask[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
        next_adv = torch.where(m, a, next_adv)  # a skipped token carries the later step's values through
        next_value = torch.where(m, v[:, t], next_value)
    returns = torch.where(mask, adv + v, torch.zeros_like(adv))
    return adv.to(torch.float32), returns.to(torch.float32)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the entries where ``mask`` is nonzero (unbiased var, as verl's
    ``masked_whiten``); 0 off the mask. One entry (var undefined): ``x - mean`` = 0."""
    m = mask != 0
    n = int(m.sum())
    if n == 0:
        return torch.zeros_like(x)
    vals = x[m].to(torch.float64)
    mean = vals.mean()
    var = vals.var(unbiased=True) if n > 1 else torch.zeros((), dtype=torch.float64)
    out = ((x.to(torch.float64) - mean) * torch.rsqrt(var + eps)).to(x.dtype)
    return torch.where(m, out, torch.zeros_like(out))


def gae_from_inputs(inputs: AdvantageInputs, cfg: Any) -> tuple[Tensor, Tensor]:
    """``(whitened advantages, returns)`` ``[B, T]`` of ``inputs`` under ``cfg.gamma`` / ``cfg.lam``: the token
    rewards are ``inputs.token_rewards`` when given, else ``token_level_rewards(inputs.rewards, mask)``.
    Raises ValueError when ``inputs.values`` is None (the critic's values are required)."""
    if inputs.values is None:
        raise ValueError("algo.estimator='gae' needs the critic's values (AdvantageInputs.values [B, T]); "
                         "the critic actor starts when algo.estimator=gae")
    mask = inputs.response_mask
    r = inputs.token_rewards if inputs.token_rewards is not None else token_level_rewards(inputs.rewards, mask)
    adv, returns = gae_advantages_returns(r, inputs.values, mask, cfg.gamma, cfg.lam)
    return masked_whiten(adv, mask), returns


@register_advantage_estimator("gae")
def gae(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """PPO's advantages with a value model: GAE (Schulman et al. 2016, eq. 16, ``algo.gamma``, ``algo.lam``)
    over the response tokens, whitened over the batch; see the module docstring. Needs ``inputs.values``
    (the critic's, ``[B, T]``). Returns ``[B, T]`` float32; the value targets come from ``gae_from_inputs``."""
    return gae_from_inputs(inputs, cfg)[0]
