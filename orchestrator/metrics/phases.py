"""Busy and idle time per role from one step's phase times (the pipeline bubbles the sizer removes).

In the synchronous step every role waits while the others work. A role is busy during the phases it runs:

    rollout   : generate (each worker its own generate seconds) + weight_sync (engines load)
    reward    : reward
    reference : reference
    trainer   : train + weight_sync (sends) + checkpoint

and idle for the rest of the step. `roles/<role>_busy_s` and `roles/<role>_idle_frac` go into the
step's row (JSONL; Prometheus `rl_orch_role_busy_seconds` / `rl_orch_role_idle_ratio{role=...}`).
The controller times each phase with `PhaseTimer`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

ROLE_PHASES = {
    "rollout": ("generate", "weight_sync"),
    "reward": ("reward",),
    "reference": ("reference",),
    "trainer": ("train", "weight_sync", "checkpoint"),
}


class PhaseTimer:
    """Wall seconds per named phase of one step: `timing/<phase>_s` (a phase timed twice adds up)."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"timing/{name}_s"] = self.times.get(f"timing/{name}_s", 0.0) + time.perf_counter() - t0


def role_utilisation(row: dict, roles: tuple[str, ...] = tuple(ROLE_PHASES),
                     generate_busy_s: float | None = None) -> dict[str, float]:
    """{"roles/<role>_busy_s": seconds, "roles/<role>_idle_frac": fraction in [0, 1]} per role.

    row: a step's metrics with `timing/<phase>_s` (seconds) and `timing/step_s`. generate_busy_s: the
    rollout workers' own mean generate seconds, when known (a worker that finishes early idles while the
    slowest one still generates); else the generate phase's wall time counts as busy.
    Raises ValueError when `timing/step_s` is missing or not positive.
    """
    step = row.get("timing/step_s")
    if not step or step <= 0:
        raise ValueError(f"role_utilisation: the row needs a positive timing/step_s, got {step!r}")
    out: dict[str, float] = {}
    for role in roles:
        busy = 0.0
        for phase in ROLE_PHASES[role]:
            if role == "rollout" and phase == "generate" and generate_busy_s is not None:
                busy += generate_busy_s
            else:
                busy += float(row.get(f"timing/{phase}_s", 0.0))
        busy = min(busy, step)
        out[f"roles/{role}_busy_s"] = busy
        out[f"roles/{role}_idle_frac"] = 1.0 - busy / step
    return out
