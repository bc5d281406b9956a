"""A workload (phase laws of every role) and a split (the GPUs each role holds in one mode).

Pure Python. `Workload.costs(split)` turns the laws into one step's phase costs at that split and
`evaluate` simulates it (orchestrator.sizing.simulator); `all_splits` enumerates every valid split of a
GPU total, which the brute force (orchestrator.sizing.sizer.brute_force) and the tests use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional

from orchestrator.utils.finite import check_finite_nonnegative
from orchestrator.sizing.scaling import Law, constant
from orchestrator.sizing.phases import check_scale
from orchestrator.sizing.simulator import MODES, SimResult, StepCosts, simulate
from orchestrator.sizing.stream_sim import choose_k


class SizingError(ValueError):
    """A sizing request that cannot be met (too few GPUs, an unreachable target, a bad workload)."""


@dataclass(frozen=True)
class Split:
    """GPUs per role in one mode. colocated: rollout == trainer == the shared GPUs, reference 0 (on
    them too). Otherwise separate GPUs; reference 0 = the reference (if any) runs on the trainer's GPUs."""

    mode: str
    rollout: int
    trainer: int
    reference: int = 0

    @property
    def total(self) -> int:
        """GPUs the split occupies."""
        return self.rollout if self.mode == "colocated" else self.rollout + self.trainer + self.reference

    def describe(self, workload: "Workload") -> str:
        """e.g. 'async: rollout 40 (5 engines x TP 8), trainer 24, reference on trainer'."""
        tp = workload.rollout_unit
        engines = f" ({self.rollout // tp} engines x TP {tp})" if tp > 1 else ""
        if self.mode == "colocated":
            roles = "rollout, trainer, reference" if workload.reference else "rollout, trainer"
            return f"colocated: {self.rollout} shared GPUs{engines} ({roles})"
        ref = ""
        if workload.reference is not None:
            ref = f", reference {self.reference}" if self.reference else ", reference on trainer"
        return f"{self.mode}: rollout {self.rollout}{engines}, trainer {self.trainer}{ref}"


@dataclass(frozen=True)
class Workload:
    """Laws of seconds per step vs the role's GPUs, constant phases, and placement granularity.

    generate/train/sync/reference: scaling laws (sync in the rollout GPU count: its receivers).
    reference None = no reference model. reward_s: CPU, independent of the split. checkpoint_s: per step,
    amortised. switch_s: colocated wake/sleep per step. *_unit: a role's GPUs come in multiples of it
    (rollout: the engine's tensor-parallel size; trainer: its sharding/node granularity).
    staleness: async mode's bound (algo.max_staleness).
    generate_scale: per-step multipliers of the generate law (step k: generate_scale[(k - 1) % len]; the
    measured step-to-step variation, orchestrator.sizing.measurements); () = the same time every step.
    Stream mode (orchestrator.sizing.stream_sim): max_k, the largest k tried; k_tolerance, the fraction of
    the best step time within which the smallest k is chosen; recompute_s, rollout seconds to re-prefill
    the requests a weight sync interrupts (0 = not counted: one prefill of the tokens in flight, small
    against their decode). sync_hidden_frac: the fraction of the weight sync the trainer does not wait for in
    stream mode (weight_sync.overlap: measured from overlapped runs, `measurements.sync_hidden_frac`); 0 = the
    whole sync on the trainer (a bound on the safe side).
    """

    generate: Law
    train: Law
    sync: Law = constant(0.0)
    reference: Optional[Law] = None
    reward_s: float = 0.0
    checkpoint_s: float = 0.0
    switch_s: float = 0.0
    rollout_unit: int = 1
    trainer_unit: int = 1
    reference_unit: int = 1
    staleness: int = 1
    critic_s: float = 0.0  # PPO's critic update per step on its own device (StepCosts.critic_s); 0 = none
    generate_scale: tuple[float, ...] = ()
    max_k: int = 4
    k_tolerance: float = 0.02
    recompute_s: float = 0.0
    sync_hidden_frac: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rollout_unit", "trainer_unit", "reference_unit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SizingError(f"{name}: must be an integer >= 1 (got {v!r})")
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 1:
            raise SizingError(f"staleness: must be an integer >= 1 (got {self.staleness!r})")
        if isinstance(self.max_k, bool) or not isinstance(self.max_k, int) or self.max_k < 1:
            raise SizingError(f"max_k: must be an integer >= 1 (got {self.max_k!r})")
        check_finite_nonnegative(self, ("k_tolerance", "recompute_s", "sync_hidden_frac"), SizingError)
        if self.sync_hidden_frac > 1:
            raise SizingError(f"sync_hidden_frac: must be at most 1 (got {self.sync_hidden_frac!r})")
        try:
            check_scale(self.generate_scale)
        except ValueError as e:
            raise SizingError(str(e)) from None

    def reference_placement(self, split: Split) -> Optional[str]:
        """The simulator's reference argument: None, 'own' or 'trainer'."""
        if self.reference is None:
            return None
        return "own" if split.mode != "colocated" and split.reference > 0 else "trainer"

    def costs(self, split: Split) -> StepCosts:
        """One step's phase costs at `split` (colocated: every law at the shared GPU count)."""
        r = split.rollout
        t = split.rollout if split.mode == "colocated" else split.trainer
        f = split.reference if split.mode != "colocated" and split.reference > 0 else t
        sync = self.sync(r)
        return StepCosts(generate_s=self.generate(r), train_s=self.train(t), sync_s=sync,
                         reward_s=self.reward_s, reference_s=self.reference(f) if self.reference else 0.0,
                         checkpoint_s=self.checkpoint_s,
                         switch_s=self.switch_s if split.mode == "colocated" else 0.0, critic_s=self.critic_s,
                         recompute_s=self.recompute_s if split.mode == "stream" else 0.0,
                         sync_hidden_s=sync * self.sync_hidden_frac if split.mode == "stream" else 0.0)

    def min_gpus(self, mode: str) -> int:
        """The fewest GPUs a split of `mode` needs (colocated: lcm of the units, roles share them)."""
        if mode == "colocated":
            units = [self.rollout_unit, self.trainer_unit] + ([self.reference_unit] if self.reference else [])
            return math.lcm(*units)
        return self.rollout_unit + self.trainer_unit


def evaluate(workload: Workload, split: Split) -> SimResult:
    """Simulate `split` (orchestrator.sizing.simulator.simulate) with the workload's staleness and per-step
    generate multipliers; stream mode tries k = 1..max_k and keeps the smallest k within k_tolerance of the
    best (orchestrator.sizing.stream_sim.choose_k: result.k, result.step_by_k)."""
    w, costs, ref = workload, workload.costs(split), workload.reference_placement(split)
    if split.mode == "stream":
        return choose_k(costs, ref, w.max_k, w.k_tolerance, w.generate_scale)
    return simulate(split.mode, costs, w.staleness, ref, generate_scale=w.generate_scale)


def split_from(workload: Workload, mode: str, total: int, rollout: int, reference: int = 0) -> Optional[Split]:
    """The split with these rollout/reference GPUs whose trainer takes the rest, rounded down to its
    unit; None when the trainer is left fewer than one unit. colocated: `rollout` shared GPUs."""
    if mode == "colocated":
        return Split(mode, rollout, rollout, 0) if 0 < rollout <= total else None
    trainer = (total - rollout - reference) // workload.trainer_unit * workload.trainer_unit
    if rollout < workload.rollout_unit or trainer < workload.trainer_unit or reference < 0:
        return None
    return Split(mode, rollout, trainer, reference)


def all_splits(workload: Workload, total: int, mode: str) -> Iterator[Split]:
    """Every valid split of `total` GPUs in `mode`.

    colocated: every multiple of min_gpus up to total. Otherwise every rollout multiple of rollout_unit
    and every reference multiple of reference_unit (0 = on the trainer; only with a reference), the
    trainer taking the rest rounded down to its unit. Splits that leave trainer-usable GPUs idle are not
    listed: the trainer's law never grows with GPUs (a, b >= 0, alpha >= 0) and no other phase depends
    on the trainer's count, so they are never faster than the listed one with the same rollout/reference.
    """
    if mode not in MODES:
        raise SizingError(f"mode: expected one of {list(MODES)} (got {mode!r})")
    if mode == "colocated":
        unit = workload.min_gpus(mode)
        for g in range(unit, total + 1, unit):
            yield Split(mode, g, g, 0)
        return
    refs = [0] + (list(range(workload.reference_unit, total + 1, workload.reference_unit))
                  if workload.reference is not None else [])
    for f in refs:
        for r in range(workload.rollout_unit, total + 1, workload.rollout_unit):
            split = split_from(workload, mode, total, r, f)
            if split is None:
                break  # more rollout GPUs leave the trainer even less
            yield split
