"""Run-health guards (the `guards` config section; reward_collapse, length_pinned, entropy_collapse, update_explosion,
grad_norm_spike on by default), each a `guard/<name>`
metric in the step's row (1 = tripped this step, 0 = not; absent when the guard is off) and a printed warning;
with `guards.action=stop` a tripped guard stops the run (`GuardTripped`). Prometheus alerts on
`rl_orch_guard_tripped{guard=...}` live in deploy/prometheus/alerts.yml. Pure: no Ray, no torch.

| guard | trips when |
|---|---|
| reward_collapse | `reward/std` is 0 (every sample got the same reward, e.g. all 0) for `reward_collapse_steps` steps in a row |
| length_pinned | `rollout/truncated_frac` >= `truncated_frac` for `truncated_steps` steps in a row |
| entropy_collapse | `actor/entropy` (mean token entropy, nats) < `entropy_floor` for `entropy_collapse_steps` steps in a row |
| update_explosion | `actor/update_ratio` (an update's ||delta theta|| / ||theta_old||, actors/trainer/update_size.py) > `update_ratio_max` |
| kl_spike | `actor/kl` > `kl_spike_factor` x the median of its last `spike_window` values |
| grad_norm_spike | `actor/grad_norm` > `grad_norm_spike_factor` x the median of its last `spike_window` values |

A spike counts once the window holds `spike_min_steps` finite values with a median above 0; every finite value
joins the window after the check (a spike too); NaN and inf never do (a skipped update's NaN grad norm is the
trainer's business: actors/trainer/finite.py).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Optional

GUARDS = ("reward_collapse", "length_pinned", "entropy_collapse", "update_explosion", "kl_spike", "grad_norm_spike")


class GuardTripped(RuntimeError):
    """A guard tripped with guards.action=stop; the message names the guard, the step and the values."""


def check_guards_config(guards, kl_coef: float) -> None:
    """Raise ValueError naming the key for a spike factor in (0, 1] (it would trip on every step), spike_min_steps
    above spike_window (no spike would ever count) or a KL guard without a reference model (algo.kl_coef = 0:
    actor/kl is always 0)."""
    for key in ("kl_spike_factor", "grad_norm_spike_factor"):
        factor = getattr(guards, key)
        if 0 < factor <= 1:
            raise ValueError(f"guards.{key}={factor!r} must be 0 (off) or > 1: a value at most its running median "
                             "is no spike")
    if guards.spike_min_steps > guards.spike_window:
        raise ValueError(f"guards.spike_min_steps={guards.spike_min_steps} exceeds guards.spike_window="
                         f"{guards.spike_window}: the window never holds that many values, so no spike would ever count; "
                         "lower guards.spike_min_steps or raise guards.spike_window")
    if guards.kl_spike_factor > 0 and kl_coef <= 0:
        raise ValueError(f"guards.kl_spike_factor={guards.kl_spike_factor!r} watches actor/kl, the policy-reference KL, "
                         "which needs algo.kl_coef > 0 (got 0): set algo.kl_coef or guards.kl_spike_factor=0")


def in_a_row(count: int, hit: Optional[bool]) -> int:
    """Steps in a row a condition held: count + 1 when `hit`, 0 when not, unchanged when unknown (None)."""
    if hit is None:
        return count
    return count + 1 if hit else 0


def is_spike(value, history, factor: float, min_steps: int) -> Optional[str]:
    """A description of the spike when `value` > factor x median(history), else None; needs min_steps values in
    `history` and a median above 0."""
    if value is None or not math.isfinite(value) or len(history) < min_steps:
        return None
    median = statistics.median(history)
    if median > 0 and value > factor * median:
        return f"{value:.4g} > {factor:g} x running median {median:.4g}"
    return None


class HealthGuards:
    """The enabled guards of one run (`guards`: the GuardsConfig section); `observe(step, row)` per step."""

    def __init__(self, guards):
        self.g = guards
        self.streak = {"reward_collapse": 0, "length_pinned": 0, "entropy_collapse": 0}
        self.history = {"kl_spike": deque(maxlen=guards.spike_window),
                        "grad_norm_spike": deque(maxlen=guards.spike_window)}

    def enabled(self) -> dict[str, bool]:
        g = self.g
        return {"reward_collapse": g.reward_collapse_steps > 0, "length_pinned": g.truncated_steps > 0,
                "entropy_collapse": g.entropy_collapse_steps > 0 and g.entropy_floor > 0,
                "update_explosion": g.update_ratio_max > 0,
                "kl_spike": g.kl_spike_factor > 0, "grad_norm_spike": g.grad_norm_spike_factor > 0}

    def observe(self, step: int, row: dict) -> dict[str, float]:
        """{"guard/<name>": 0.0 or 1.0} of every enabled guard; prints a warning per tripped one. Raises
        GuardTripped (naming every tripped guard) with guards.action=stop."""
        tripped = {name: why for name, why in self._check(row).items() if self.enabled()[name]}
        out = {f"guard/{name}": float(why is not None) for name, why in tripped.items()}
        alarms = [f"guard {name} at step {step}: {why}" for name, why in tripped.items() if why is not None]
        for line in alarms:
            print(f"WARNING: {line}", flush=True)
        if alarms and self.g.action == "stop":
            raise GuardTripped("; ".join(alarms) + " (guards.action=stop; set guards.action=warn to only warn)")
        return out

    def state_dict(self) -> dict:
        """The streaks and the spike windows: a resumed run's guards trip where the uninterrupted run's would."""
        return {"streak": dict(self.streak), "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.streak.update({k: int(v) for k, v in state["streak"].items()})
        for name, values in state["history"].items():
            self.history[name].clear()
            self.history[name].extend(float(v) for v in values)

    def _check(self, row: dict) -> dict[str, Optional[str]]:
        g, why = self.g, {}
        std, frac = row.get("reward/std"), row.get("rollout/truncated_frac")
        n = self._count("reward_collapse", None if std is None else abs(std) <= 1e-12)
        why["reward_collapse"] = (f"every sample got the same reward (reward/mean {row.get('reward/mean')}) for {n} "
                                  "steps in a row: no learning signal"
                                  if std is not None and n >= g.reward_collapse_steps > 0 else None)
        n = self._count("length_pinned", None if frac is None else frac >= g.truncated_frac)
        why["length_pinned"] = (f"{frac:.0%} of the responses hit rollout.max_new_tokens for {n} steps in a row "
                                f"(guards.truncated_frac={g.truncated_frac:g})"
                                if frac is not None and n >= g.truncated_steps > 0 else None)
        ent = row.get("actor/entropy")
        n = self._count("entropy_collapse", None if ent is None or not math.isfinite(ent) else ent < g.entropy_floor)
        why["entropy_collapse"] = (f"actor/entropy {ent:.3g} nats per token < guards.entropy_floor={g.entropy_floor:g} "
                                   f"for {n} steps in a row: the policy samples nearly one answer, its groups stop "
                                   "giving an advantage (raise the temperature, algo.clip_high or algo.entropy_coef)"
                                   if ent is not None and n >= g.entropy_collapse_steps > 0 else None)
        ratio = row.get("actor/update_ratio")
        why["update_explosion"] = (f"actor/update_ratio {ratio:.3g} > guards.update_ratio_max={g.update_ratio_max:g}: "
                                   f"an update moved the weights by {ratio:.3g} of their norm (actor/lr "
                                   f"{row.get('actor/lr')}): the policy diverges; lower trainer.lr"
                                   if ratio is not None and ratio > g.update_ratio_max > 0 else None)
        for name, key, factor in (("kl_spike", "actor/kl", g.kl_spike_factor),
                                  ("grad_norm_spike", "actor/grad_norm", g.grad_norm_spike_factor)):
            value, history = row.get(key), self.history[name]
            spike = is_spike(value, history, factor, g.spike_min_steps) if factor > 0 else None
            why[name] = f"{key} {spike}" if spike else None
            if value is not None and math.isfinite(value):
                history.append(value)
        return why

    def _count(self, name: str, hit: Optional[bool]) -> int:
        self.streak[name] = in_a_row(self.streak[name], hit)
        return self.streak[name]
