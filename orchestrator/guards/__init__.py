"""Guards that watch each step's metrics row on the controller (pure: no Ray, no torch).

    guards = RunGuards(cfg)                  # run.max_skipped_updates, the guards.* section
    row.update(guards.after_step(step, row)) # adds actor/skipped_updates_total, actor/skipped_in_a_row, guard/*

- `skipped.py`: updates the trainer skipped (non-finite loss, grad norm or weights; actors/trainer/finite.py),
  counted over the run; `run.max_skipped_updates` in a row raise `DivergedError` naming what was non-finite,
  at which steps, and what to do.
- `signals.py`: optional guards (reward collapse, responses pinned at the length limit, KL and grad-norm
  spikes): a `guard/<name>` metric (0/1) and a printed warning; `guards.action=stop` raises `GuardTripped`.
"""
from __future__ import annotations

from orchestrator.guards.signals import GuardTripped, HealthGuards, check_guards_config
from orchestrator.guards.skipped import DivergedError, SkippedUpdates


class RunGuards:
    """Both kinds of guard over one run: `after_step(step, row)` returns the metrics to add to the row (the
    skip counters and `guard/*`), prints a warning per tripped guard, and raises DivergedError or
    GuardTripped when the run must stop."""

    def __init__(self, cfg):
        self.skipped = SkippedUpdates(cfg.run.max_skipped_updates, cfg.trainer.mini_batches, cfg.trainer.lr)
        self.health = HealthGuards(cfg.guards)

    def after_step(self, step: int, row: dict) -> dict:
        out = self.skipped.observe(step, row)
        out.update(self.health.observe(step, row))
        return out

    def state_dict(self) -> dict:
        """The counters, streaks and windows, for a checkpoint: a resume continues them (exact resume)."""
        return {"skipped": self.skipped.state_dict(), "health": self.health.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        """`state_dict()`'s value; None (a checkpoint written before guards were saved) keeps fresh counters."""
        if state:
            self.skipped.load_state_dict(state["skipped"])
            self.health.load_state_dict(state["health"])


__all__ = ["DivergedError", "GuardTripped", "HealthGuards", "RunGuards", "SkippedUpdates", "check_guards_config"]
