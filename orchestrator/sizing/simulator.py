"""Pipeline simulator: the steady-state step time of a placement mode from the phase costs of one step.

Pure Python. Each step k is a small graph of phases; every phase occupies one or more resources:

    generate_k  (rollout)           reward_k (cpu)     reference_k (reference, or trainer when shared)
    train_k     (trainer)           weight sync_k (trainer AND rollout: the engines load while not
    checkpoint_k (trainer)          generating)
    critic_k (critic, PPO with a value model: its update beside train_k; sync_k waits for it)

Data dependencies: reward_k and reference_k need generate_k; train_k needs reward_k and reference_k;
sync_k needs train_k; checkpoint_k needs sync_k. Modes:

- "colocated": one resource "gpus" holds trainer, reference and rollout, time-sliced:
  generate, switch (engines sleep, trainer wakes), reference, train, sync, switch (back). Reward runs
  on the CPU and may overlap the switch and the reference. generate_{k+1} needs sync_k.
- "disaggregated": separate rollout and trainer GPUs, synchronous: generate_{k+1} needs sync_k.
- "async" (one step off-policy for staleness 1): generate_k needs sync_{k-1-s} only (s = staleness),
  so the rollouts of step k+1 overlap the training of step k; the samples of step k come from weights
  at most s versions old. On the rollout GPUs sync_m runs between generate_{m+s} and generate_{m+s+1}.
- "stream" (fully asynchronous with partial rollouts, k = staleness): generation is continuous and a sync
  interrupts it instead of waiting for it; its own event loop, orchestrator.sizing.stream_sim.

generate_scale (optional, every mode): per-step multipliers of the generation time, replayed in a cycle
(the step-to-step variation measured by orchestrator.sizing.measurements); the measured window then spans
whole cycles (orchestrator.sizing.phases.window_steps).

Each resource runs its phases one at a time in a fixed order (program order of the controller). The
simulation is event-driven over that order: a phase starts at the event that makes it runnable (its
last dependency finishing, or the previous phase on each of its resources finishing), i.e. at the
longest path to it through the graph of dependency and resource-order edges. The step time is the
steady-state period: (end of sync_K - end of sync_{K-M}) / M over the last M of K simulated steps
(the schedule of such max-plus systems becomes periodic after a few steps; Baccelli et al. 1992,
"Synchronization and Linearity", ch. 3). Busy fractions are measured over the same window.
"""
from __future__ import annotations

from orchestrator.sizing.phases import (CYCLICITY, Phase, SimResult, StepCosts, check_scale, measure, scale_at,
                                        window_steps)
from orchestrator.sizing.stream_sim import simulate_stream

__all__ = ["MODES", "Phase", "SimResult", "StepCosts", "build_schedule", "simulate"]

MODES: tuple[str, ...] = ("colocated", "disaggregated", "async", "stream")


def _emit(mode: str, c: StepCosts, steps: int, s: int, ref_res: str | None,
          scale: tuple[float, ...] = ()) -> list[Phase]:
    """The phases in an order that is both topological and each resource's run order.

    Synchronous modes, per step k: generate, [switch], reward, [reference], train, sync, [switch],
    checkpoint. Async with staleness s >= 1, per iteration j: generate_j, reward_j, reference_j (own
    GPUs), then sync_{j-s} and checkpoint_{j-s} (the rollout GPUs run sync_m after generate_{m+s}), then
    train_{j-s+1} (with its reference first when that runs on the trainer). Generation runs s steps past
    the last trained step so that every sync_m has its generate_{m+s} before it."""
    gpu = "gpus" if mode == "colocated" else None
    roll, train = gpu or "rollout", gpu or "trainer"
    ref_on = gpu or ref_res
    out: list[Phase] = []

    def add(name, k, dur, res, deps):
        out.append(Phase(f"{name}_{k}", k, dur, res, deps))

    def generate(k, deps):
        add("generate", k, c.generate_s * scale_at(scale, k), (roll,), deps)
        add("reward", k, c.reward_s, ("cpu",), [f"generate_{k}"])
        if ref_res == "reference" and mode != "colocated":
            add("reference", k, c.reference_s, ("reference",), [f"generate_{k}"])

    def train_phase(k, after):
        deps = [f"reward_{k}", after]
        if ref_on is not None:
            if not (ref_res == "reference" and mode != "colocated"):
                add("reference", k, c.reference_s, (ref_on,), [after])
            deps.append(f"reference_{k}")
        add("train", k, c.train_s, (train,), deps)
        if c.critic_s > 0:  # the critic trains on the same batch, beside the policy (colocated: after it)
            add("critic", k, c.critic_s, (gpu or "critic",), deps)

    def sync(k, deps):
        critic = [f"critic_{k}"] if c.critic_s > 0 else []  # the controller waits for both updates
        add("sync", k, c.sync_s, tuple(dict.fromkeys((train, roll))), [f"train_{k}", *critic, *deps])
        if mode == "colocated":
            add("switch_b", k, c.switch_s / 2, (gpu,), [f"sync_{k}"])
        add("checkpoint", k, c.checkpoint_s, (train,), [f"sync_{k}"])

    if s == 0:
        for k in range(1, steps + 1):
            generate(k, [])
            after = f"generate_{k}"
            if mode == "colocated":
                add("switch_a", k, c.switch_s / 2, (gpu,), [after])
                after = f"switch_a_{k}"
            train_phase(k, after)
            sync(k, [])
        return out
    for j in range(1, steps + s + 1):
        generate(j, [f"sync_{j - 1 - s}"] if j - 1 - s >= 1 else [])
        if 1 <= j - s <= steps:
            sync(j - s, [f"generate_{j}"])
        if 1 <= j - s + 1 <= steps:
            train_phase(j - s + 1, f"generate_{j - s + 1}")
    return out


def build_schedule(mode: str, costs: StepCosts, steps: int, staleness: int = 1,
                   reference: str | None = None, generate_scale: tuple[float, ...] = ()) -> list[Phase]:
    """The phases of `steps` steps, timed: each starts at max(end of its dependencies, the time each of
    its resources is free), in the order `_emit` gives (each resource's run order).

    reference: None (no reference model), "own" (its own GPUs) or "trainer" (on the trainer's GPUs).
    generate_scale: per-step multipliers of costs.generate_s (see `simulate`). Whole-generation modes only
    (stream mode's schedule: orchestrator.sizing.stream_sim.build_stream_schedule).
    Raises ValueError for an unknown mode or reference placement, steps < 1 or staleness < 0.
    """
    if mode not in MODES or mode == "stream":
        raise ValueError(f"mode: expected one of {list(MODES[:-1])} (got {mode!r})")
    if reference not in (None, "own", "trainer"):
        raise ValueError(f"reference: expected None, 'own' or 'trainer' (got {reference!r})")
    if steps < 1 or staleness < 0:
        raise ValueError(f"steps must be >= 1 and staleness >= 0 (got {steps}, {staleness})")
    s = staleness if mode == "async" else 0
    ref_res = None if reference is None else ("reference" if reference == "own" else "trainer")
    phases = _emit(mode, costs, steps, s, ref_res, check_scale(generate_scale))
    end: dict[str, float] = {}
    free: dict[str, float] = {}
    for p in phases:
        p.start = max([end[d] for d in p.deps if d in end] + [free.get(r, 0.0) for r in p.resources])
        p.end = end[p.name] = p.start + p.duration
        for r in p.resources:
            free[r] = p.end
    return phases


def simulate(mode: str, costs: StepCosts, staleness: int = 1, reference: str | None = None,
             steps: int | None = None, generate_scale: tuple[float, ...] = ()) -> SimResult:
    """Simulate `steps` steps (default 8 + 4 * staleness, see phases.window_steps) and return the steady-state
    period, the busy fraction of every resource over the last half of the steps, and the schedule.

    generate_scale: per-step multipliers of costs.generate_s (step k uses generate_scale[(k - 1) % len]);
    () = the same generation time every step. mode "stream" is orchestrator.sizing.stream_sim.simulate_stream
    with k = staleness. See `build_schedule` for the other arguments and errors; a multiplier that is not
    a finite number > 0 raises ValueError naming generate_scale."""
    scale = check_scale(generate_scale)
    if mode == "stream":
        return simulate_stream(costs, staleness, reference, steps, scale)
    s = staleness if mode == "async" else 0
    n, m = (steps, max(1, steps // 2)) if steps else window_steps(s, len(scale), CYCLICITY if scale else 1)
    phases = build_schedule(mode, costs, n, staleness, reference, scale)
    return measure(mode, phases, n, m, "switch_b_" if mode == "colocated" else "sync_", s)
