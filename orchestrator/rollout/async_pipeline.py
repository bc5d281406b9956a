"""Scheduling of `rollout.mode=one_step_off`: which batch is generated when, by which weights,
and whether it is fresh enough to train on. Pure Python (no Ray, no torch): the controller asks it,
`tests/unit/test_async_pipeline.py` simulates it with random durations.

    pipe = AsyncPipeline(max_staleness=1, total_steps=100)
    for step in range(1, 101):
        for ticket in pipe.to_launch(step):       # launch these generations now (engine weights: ticket.weight_version)
            ...
        adm = pipe.admit(step, policy_version)    # the batch of `step` arrived: within the bound?
        if not adm.admitted:                      # too stale: dropped (counted), regenerated with current weights
            ticket = pipe.regenerate(step)
        ...train...; wait for the generations still running; pipe.arrived(each)
        pipe.synced(step)                         # the engines now hold version `step`

Versions count policy updates: the initial weights are version 0, the trainer's weights after training
step k are version k, and weight sync k brings the engines to version k. A batch's *weight version* is the
version the engines held when they generated it; its *staleness* is the version of the policy being
trained on it (the trainer's weights before the update, k - 1 at step k) minus its weight version. A
synchronous run has staleness 0 on every step; one step off-policy (verl's one-step-off, AReaL's
`max_head_offpolicyness` = 1, NeMo-RL's `max_trajectory_age_steps` = 1) has 1 after the first step.

Launch rule: at the start of step k the batches of steps k .. k + depth (never beyond total_steps) are
launched, each generated with the weights the engines hold then (the controller waits for every
in-flight generation before a weight sync, so no sync lands inside a generation). A batch launched at
step j - depth with weights j - depth - 1 is trained at step j by policy j - 1: staleness = depth.
`depth` defaults to min(max_staleness, 1): the controller's verified sync waits for the in-flight batch,
so a deeper queue would add staleness without hiding more generation time. max_staleness = 0 (or
depth 0) is exactly the synchronous order: launch, wait, train, sync.

Admission: a batch whose staleness exceeds `max_staleness` is dropped, counted in
`async/dropped_batches`, and regenerated with the current weights (staleness 0). With the default depth
that never happens on a healthy run; it guards against batches that outlived their bound (a depth
above the bound, engines re-placed while a batch was in flight, a sync that did not reach the engines).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Ticket:
    """One launched generation: the training step whose batch it is and the engines' weight version."""

    step: int
    weight_version: int


@dataclass(frozen=True)
class Admission:
    """The decision on a batch that arrived for training: staleness = policy_version - weight_version."""

    step: int
    weight_version: int
    policy_version: int
    staleness: int
    admitted: bool


class AsyncPipeline:
    """Launch plan and staleness bound of the one-step-off pipeline (see the module docstring).

    Args:
        max_staleness: the bound, >= 0 (`algo.max_staleness`); 0 = synchronous.
        total_steps: the run's last step (`trainer.total_steps`); nothing is launched past it.
        start_step: steps already trained (a resume starts at the checkpoint's step; nothing is in
            flight then: a batch in flight at save time is regenerated, never half-applied).
        depth: batches generated ahead of the one being trained; default min(max_staleness, 1).
    Raises:
        ValueError: a negative max_staleness or depth, total_steps < 1, start_step outside [0, total_steps].
    """

    def __init__(self, max_staleness: int, total_steps: int, start_step: int = 0, depth: Optional[int] = None):
        if not (isinstance(max_staleness, int) and max_staleness >= 0):
            raise ValueError(f"algo.max_staleness={max_staleness!r} must be an integer >= 0")
        if total_steps < 1:
            raise ValueError(f"trainer.total_steps={total_steps!r} must be >= 1")
        if not 0 <= start_step <= total_steps:
            raise ValueError(f"start_step={start_step!r} must be in [0, trainer.total_steps={total_steps}]")
        depth = min(max_staleness, 1) if depth is None else depth
        if not (isinstance(depth, int) and depth >= 0):
            raise ValueError(f"depth={depth!r} must be an integer >= 0")
        self.max_staleness, self.total_steps, self.depth = max_staleness, total_steps, depth
        self.engine_version = start_step  # the controller syncs the checkpoint's weights on resume
        self.in_flight: dict[int, Ticket] = {}  # launched, not trained yet
        self.running: set[int] = set()  # launched, generation not returned yet
        self.next_step = start_step + 1  # the first step not launched yet
        self.dropped = 0
        self.max_staleness_seen = 0

    def to_launch(self, step: int) -> list[Ticket]:
        """Tickets for the generations to launch at the start of training step `step`, in step order:
        steps step .. min(step + depth, total_steps) not launched yet, at the engines' current version.
        Raises ValueError when `step` is not the next step to train."""
        if step in self.in_flight or step == self.next_step:
            out = []
            while self.next_step <= min(step + self.depth, self.total_steps):
                out.append(self._launch(self.next_step))
            return out
        raise ValueError(f"step {step}: its batch was neither launched nor is it the next step {self.next_step}")

    def admit(self, step: int, policy_version: int) -> Admission:
        """Take the batch of `step` off the in-flight list and decide on it. policy_version: the trainer's
        weight version (it trains from these). A batch over the bound is dropped and counted; call
        `regenerate(step)` then. Raises KeyError when no batch of `step` is in flight."""
        if step not in self.in_flight:
            raise KeyError(f"step {step}: no batch in flight (in flight: {sorted(self.in_flight)})")
        ticket = self.in_flight.pop(step)
        self.running.discard(step)
        staleness = policy_version - ticket.weight_version
        if staleness < 0:
            raise ValueError(f"step {step}: batch of weight version {ticket.weight_version} is newer than the policy "
                             f"version {policy_version} it trains")
        admitted = staleness <= self.max_staleness
        if admitted:
            self.max_staleness_seen = max(self.max_staleness_seen, staleness)
        else:
            self.dropped += 1
        return Admission(step, ticket.weight_version, policy_version, staleness, admitted)

    def regenerate(self, step: int) -> Ticket:
        """A new ticket for a dropped batch of `step`, at the engines' current version."""
        ticket = Ticket(step, self.engine_version)
        self.in_flight[step] = ticket
        self.running.add(step)
        return ticket

    def arrived(self, step: int) -> None:
        """The generation of `step`'s batch returned (it may wait for its training step)."""
        self.running.discard(step)

    def synced(self, version: int) -> None:
        """Weight sync `version` reached every engine. Raises ValueError when a generation is still
        running (a sync must not land inside a generation) or the version goes backwards."""
        if self.running:
            raise ValueError(f"weight sync {version} while the generations of steps {sorted(self.running)} are "
                             "running: wait for them first")
        if version < self.engine_version:
            raise ValueError(f"weight sync {version} is older than the engines' version {self.engine_version}")
        self.engine_version = version

    def discard(self) -> list[int]:
        """Forget every in-flight batch (engines restarted or re-placed); their steps are launched again
        by the next `to_launch`. Each counts as dropped. Returns the discarded steps."""
        steps = sorted(self.in_flight)
        self.dropped += len(steps)
        self.in_flight.clear()
        self.running.clear()
        if steps:
            self.next_step = steps[0]
        return steps

    def restore(self, ticket: Ticket) -> None:
        """A resume: the batch of `ticket.step`, generated before the checkpoint (by `ticket.weight_version`),
        is in flight again, already arrived; the next launch is the step after it."""
        if ticket.step <= self.engine_version or ticket.step > self.total_steps:
            raise ValueError(f"restored batch of step {ticket.step} is outside the steps to train "
                             f"({self.engine_version + 1} .. {self.total_steps})")
        self.in_flight[ticket.step] = ticket
        self.next_step = max(self.next_step, ticket.step + 1)

    def counters(self) -> dict[str, int]:
        """{"dropped", "max_staleness_seen"}: the counters a checkpoint keeps (`load_counters` restores them)."""
        return {"dropped": self.dropped, "max_staleness_seen": self.max_staleness_seen}

    def load_counters(self, counters: dict) -> None:
        self.dropped = int(counters.get("dropped", 0))
        self.max_staleness_seen = int(counters.get("max_staleness_seen", 0))

    def metrics(self, admission: Admission) -> dict[str, float]:
        """`async/*` keys of the step's row for the batch trained (see the module docstring), and
        `rollout/staleness` (the same staleness: Prometheus `rl_orch_rollout_staleness_steps`, Grafana)."""
        return {"async/staleness": admission.staleness, "async/weight_version": admission.weight_version,
                "async/max_staleness_seen": self.max_staleness_seen, "async/dropped_batches": self.dropped,
                "rollout/staleness": admission.staleness}

    def _launch(self, step: int) -> Ticket:
        ticket = Ticket(step, self.engine_version)
        self.in_flight[step] = ticket
        self.running.add(step)
        self.next_step = step + 1
        return ticket
