"""The simulators' shared types and their steady-state measurement. Pure Python.

    StepCosts   one step's phase seconds at one placement (the simulators' input)
    Phase       one timed phase of a schedule (name 'generate_3', resources held, start/end seconds)
    SimResult   steady-state seconds per step, busy fractions, the schedule, the staleness reached
    measure(...)  SimResult of a timed schedule (period over the last steps, busy fractions, weight versions)

Used by orchestrator.sizing.simulator (whole-generation modes) and orchestrator.sizing.stream_sim (streaming
generation with partial rollouts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.utils.finite import check_finite_nonnegative


@dataclass(frozen=True)
class StepCosts:
    """Seconds of each phase of one step at one placement (>= 0 each).

    reference_s: 0 when the run has no reference model. switch_s: colocated only, wake/sleep per step
    (half after generate, half after the sync). checkpoint_s: amortised per step. critic_s: PPO's critic update
    (algo.estimator=gae) on its own device (colocated: the shared GPUs, after train); 0 = no critic.
    recompute_s: stream mode only, rollout seconds to re-prefill the requests a weight sync interrupted
    (their KV was computed by the old weights), paid after each sync that lands during a generation.
    sync_hidden_s: stream mode only, the part of sync_s the trainer does not wait for (weight_sync.overlap: the
    engines' load, verification and probe run behind the next step; the trainer waits for the send alone);
    0 = the whole sync on the trainer. At most sync_s.
    """

    generate_s: float
    train_s: float
    sync_s: float = 0.0
    reward_s: float = 0.0
    reference_s: float = 0.0
    checkpoint_s: float = 0.0
    switch_s: float = 0.0
    critic_s: float = 0.0
    recompute_s: float = 0.0
    sync_hidden_s: float = 0.0

    def __post_init__(self) -> None:
        check_finite_nonnegative(self)  # ValueError "StepCosts.<field>: must be a finite number >= 0 (got ...)"
        if self.sync_hidden_s > self.sync_s:
            raise ValueError(f"StepCosts.sync_hidden_s: must be at most sync_s={self.sync_s} (got {self.sync_hidden_s})")

    @property
    def sync_on_trainer_s(self) -> float:
        """The seconds of a sync the trainer waits for: sync_s - sync_hidden_s."""
        return self.sync_s - self.sync_hidden_s

    @property
    def sync_on_rollout_s(self) -> float:
        """The seconds of a sync the engines are paused for: the whole sync_s, or with an overlapped sync only
        sync_hidden_s (they generate during the trainer's send, orchestrator/weight_sync/syncer.py `start`)."""
        return self.sync_hidden_s if self.sync_hidden_s > 0 else self.sync_s


@dataclass
class Phase:
    """One simulated phase: name like 'generate_3', step k, resources held, start/end seconds."""

    name: str
    step: int
    duration: float
    resources: tuple[str, ...]
    deps: list[str] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    weight_version: int = -1  # generate only: the newest synced version when it started


@dataclass
class SimResult:
    """step_s: steady-state seconds per step. busy: resource -> fraction of the window it was busy.
    phases: the whole simulated schedule. max_staleness: the largest (k - 1 - weight version) over
    generate_k (0 = on-policy). k: the staleness bound simulated (async: algo.max_staleness; stream: the k
    chosen), 0 for the synchronous modes. step_by_k: stream mode, seconds per step for every k tried."""

    mode: str
    step_s: float
    busy: dict[str, float]
    phases: list[Phase]
    max_staleness: int
    window: tuple[float, float] = (0.0, 0.0)
    k: int = 0
    step_by_k: dict[int, float] = field(default_factory=dict)

    def phase_share(self, kind: str) -> float:
        """Fraction of the measured window spent in phases of `kind` ('generate', 'train', 'sync', ...)."""
        t0, t1 = self.window
        total = sum(max(0.0, min(p.end, t1) - max(p.start, t0)) for p in self.phases
                    if p.name.rsplit("_", 1)[0] == kind)
        return total / (t1 - t0) if t1 > t0 else 0.0


def check_scale(generate_scale: tuple[float, ...]) -> tuple[float, ...]:
    """The per-step multipliers of generate_s (step k uses generate_scale[(k - 1) % len]); () = constant.

    Raises ValueError naming generate_scale when one is not a finite number > 0."""
    for v in generate_scale:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
            raise ValueError(f"generate_scale: every multiplier must be a finite number > 0 (got {v!r})")
    return tuple(float(v) for v in generate_scale)


def scale_at(generate_scale: tuple[float, ...], k: int) -> float:
    """The multiplier of step k (1-based), cycling over generate_scale; 1 when it is empty."""
    return generate_scale[(k - 1) % len(generate_scale)] if generate_scale else 1.0


# a max-plus schedule repeats with a period of a few steps (its cyclicity: e.g. a sync that interrupts a
# generation every 2nd or 3rd step), times the multipliers' cycle; measured windows cover CYCLICITY such periods
CYCLICITY = 12
MAX_WINDOW = 96  # steps: past this, a partial period moves the average by under ~1%


def window_steps(s: int, n_scale: int, cyclicity: int = 1) -> tuple[int, int]:
    """(steps to simulate, steps measured at the end) for staleness bound s and n_scale per-step multipliers:
    8 + 4 s steps, the last half measured, rounded up to a multiple of n_scale x cyclicity (of n_scale alone,
    at least MAX_WINDOW steps, when that is longer than MAX_WINDOW), with one multiplier cycle more of
    warm-up, so that the period averages whole cycles of the schedule."""
    base, cycle = 8 + 4 * s, max(1, n_scale)
    unit = cycle * cyclicity if cycle * cyclicity <= MAX_WINDOW else cycle
    m = unit * math.ceil(max(base // 2, min(MAX_WINDOW, cycle * cyclicity)) / unit)
    return base - base // 2 + (n_scale if n_scale > 1 else 0) + m, m


def weight_versions(phases: list[Phase]) -> int:
    """Set each generate's weight version (newest sync ended by its start); return the largest
    staleness k - 1 - version over generate_k."""
    syncs = sorted((p.end, p.step) for p in phases if p.name.startswith("sync_"))
    worst = 0
    for p in phases:
        if p.name.startswith("generate_"):
            p.weight_version = max((v for end, v in syncs if end <= p.start + 1e-9), default=0)
            worst = max(worst, p.step - 1 - p.weight_version)
    return worst


def measure(mode: str, phases: list[Phase], steps: int, m: int, last: str, k: int = 0) -> SimResult:
    """The steady-state period (end of `last`_steps - end of `last`_(steps - m)) / m, each resource's busy
    fraction over that window, and the weight versions (`weight_versions`) of a timed schedule."""
    ends = {p.step: p.end for p in phases if p.name.startswith(last)}
    t0, t1 = ends.get(steps - m, 0.0), ends[steps]
    busy: dict[str, float] = {}
    for p in phases:
        overlap = max(0.0, min(p.end, t1) - max(p.start, t0))
        for r in p.resources:
            busy[r] = busy.get(r, 0.0) + overlap
    window = t1 - t0
    busy = {r: (v / window if window > 0 else 0.0) for r, v in busy.items()}
    return SimResult(mode, window / m, busy, phases, weight_versions(phases), (t0, t1), k)
