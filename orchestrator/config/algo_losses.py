"""The ``algo`` keys of the issue-19 policy losses, a base of ``AlgoConfig`` (orchestrator/config/schema.py).

Kept in their own dataclass so schema.py stays small; the keys are plain ``algo.*`` keys
(docs/configuration.md, docs/algorithms.md; the losses in orchestrator/algo/losses_extra.py and loss.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.config.fields import number


@dataclass
class PolicyLossOptions:
    # GSPO's clip range of the sequence ratio s_i (algo.policy_loss gspo / gspo_token; the paper: 3e-4 / 4e-4)
    gspo_clip_low: float = number(3e-4, ge=0, finite=True)
    gspo_clip_high: float = number(4e-4, ge=0, finite=True)
    # CISPO's weight clip [1 - low, 1 + high] (algo.policy_loss cispo); null low = no lower bound (MiniMax-M1)
    cispo_clip_low: Optional[float] = number(None, ge=0, optional=True)
    cispo_clip_high: float = number(0.28, ge=0, finite=True)
    # dual-clip PPO (ppo_clip): for A < 0 the token loss is at most c * |A|; only ratios > c are touched; null = off
    dual_clip_c: Optional[float] = number(3.0, gt=1, optional=True)
    # entropy bonus: loss -= entropy_coef * token entropy (aggregated like the pg term); 0 = actor/entropy metric only
    entropy_coef: float = number(0.0, ge=0, finite=True)
