"""The `guards` section of the run config: the run-health guards' thresholds and action
(orchestrator/guards/signals.py, docs/monitoring.md); `check_guards_section` checks the spike factors and the KL
guard against `algo.kl_coef`.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.fields import choice, number


@dataclass
class GuardsConfig:
    """Run-health guards (orchestrator/guards/signals.py): reward collapse, pinned lengths, entropy collapse, exploding
    updates and grad-norm spikes warn by default (kl spikes need algo.kl_coef > 0: off). A tripped guard sets its `guard/<name>` metric to 1 and prints a
    warning naming the signal and the step (Prometheus alerts in deploy/prometheus/alerts.yml)."""
    action: str = choice("warn", ("warn", "stop"))  # warn | stop: what a tripped guard does to the run
    # every sample of the step got the same reward (reward/std = 0, e.g. all 0) this many steps in a row
    reward_collapse_steps: int = number(5, ge=0, note="(0 = off)")
    # rollout/truncated_frac >= truncated_frac (responses cut at max_new_tokens) this many steps in a row
    truncated_steps: int = number(5, ge=0, note="(0 = off)")
    truncated_frac: float = number(0.9, gt=0, le=1)
    # actor/entropy (mean token entropy of the trained tokens, nats) below entropy_floor this many steps in a row: a
    # collapsed policy (Yu et al. 2025, DAPO, sec. 3.1: entropy collapse)
    entropy_collapse_steps: int = number(5, ge=0, note="(0 = off)")
    entropy_floor: float = number(0.01, ge=0, finite=True, note="(0 = off)")
    # actor/update_ratio (one optimizer update's ||delta theta|| / ||theta_old||, the step's mean) above this: the policy
    # diverges. AdamW's first update moves every weight by lr, a ratio of lr / RMS(theta): the default model (RMS
    # 0.18) at trainer.lr=0.5 gives 2.7, at 2e-5 1e-4; LoRA's (B = 0) at rank r on a 4096-wide model ~160 x lr
    update_ratio_max: float = number(0.5, ge=0, finite=True, note="(0 = off)")
    # actor/kl (policy vs reference: needs algo.kl_coef > 0) / actor/grad_norm above factor x their running median
    kl_spike_factor: float = number(0.0, ge=0, note="(0 = off; else > 1)")
    grad_norm_spike_factor: float = number(10.0, ge=0, note="(0 = off; else > 1)")
    spike_window: int = number(20, ge=1)  # steps in the running median
    spike_min_steps: int = number(5, ge=1)  # values the median needs before a spike counts
    # the trainer's mean NLL of the weight-sync probe text above the starting weights' by this many nats per token:
    # the policy diverged, named before a probe mismatch blames the sync (orchestrator/weight_sync/probe.py)
    probe_nll_rise: float = number(5.0, ge=0, finite=True, note="(0 = off)")


def check_guards_section(cfg) -> None:
    """orchestrator/guards/signals.py `check_guards_config` on guards.* with algo.kl_coef.
    Raises ValueError naming the key; orchestrator/config/load.py `validate` calls it (as ConfigError)."""
    from orchestrator.guards.signals import check_guards_config

    check_guards_config(cfg.guards, cfg.algo.kl_coef)
