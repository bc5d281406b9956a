"""The verdict on one logprob probe (weight_sync.probe): each engine's scores against the trainer's, and whether
the trainer's own policy diverged since the run started (pure: no Ray; orchestrator/weight_sync/probe.py holds the
math, orchestrator/weight_sync/syncer.py gathers the scores).

    judge = ProbeJudge(cfg, start_nll)            # start_nll: the trainer's probe NLL on the starting weights
    note = judge.divergence(trainer.logprobs, version)   # once per probe, before any engine is compared
    judge.compare(i, engine_scores, trainer_scores, note, worst)   # ProbeMismatchError / PolicyDivergedError
"""
from __future__ import annotations

from typing import Optional

from orchestrator.weight_sync.probe import (
    PolicyDivergedError, ProbeMismatchError, check_probe, divergence_note, kl_tolerance_for, tolerance_for,
)


class ProbeJudge:
    """Judges the probes of one run: `cfg` (weight_sync.probe_tolerance / probe_kl_tolerance, rollout.dtype,
    guards.probe_nll_rise / guards.action) and `start_nll` (nats per token; inf: no divergence check).
    `diverged`: the divergence note of the last probe (None: not diverged)."""

    def __init__(self, cfg, start_nll: float = float("inf")):
        self.cfg, self.start_nll = cfg, start_nll
        self.diverged: Optional[str] = None

    def divergence(self, trainer_logprobs: list, version: int) -> Optional[str]:
        """The divergence note of the trainer's probe logprobs at weight `version` (`divergence_note`), said once
        when first seen: a warning naming the signal and the version; PolicyDivergedError with guards.action=stop."""
        note = divergence_note(trainer_logprobs, self.start_nll, self.cfg.guards.probe_nll_rise, version)
        if note is not None and self.diverged is None:
            if self.cfg.guards.action == "stop":
                raise PolicyDivergedError(f"{note} (guards.action=stop)")
            print(f"WARNING: {note}", flush=True)
        self.diverged = note
        return note

    def compare(self, i: int, engine, trainer, note: Optional[str], worst: dict) -> None:
        """`check_probe` of engine i's `ProbeScores` against the trainer's, its differences kept in `worst` when
        larger (`sync/probe_max_abs_diff` in nats, `sync/probe_full_kl`); with a divergence `note`, a probe mismatch
        is raised as PolicyDivergedError, not as a sync fault. Raises ProbeMismatchError naming rollout worker i."""
        ws, dtype = self.cfg.weight_sync, self.cfg.rollout.dtype
        try:
            diff, kl = check_probe(engine, trainer, tolerance_for(ws.probe_tolerance, dtype),
                                   kl_tolerance_for(ws.probe_kl_tolerance, dtype), where=f"rollout worker {i}")
            for key, value in (("sync/probe_max_abs_diff", diff), ("sync/probe_full_kl", kl)):
                if value is not None:
                    worst[key] = max(worst.get(key, 0.0), value)
        except ProbeMismatchError as e:
            if note is None:
                raise
            raise PolicyDivergedError(f"{note}. The weight sync is not at fault: the probe's difference ({e}) is "
                                      "the diverged policy's arithmetic") from None
