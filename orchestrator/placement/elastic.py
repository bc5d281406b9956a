"""placement.elastic: how many rollout engines the run should have, decided from its own measured steps (pure: no
Ray; the job adds and retires the engines, orchestrator/placement/elastic_pool.py drives it between steps).

    decision = decide_pool(rows, cfg, engines=2, room=True)    # PoolDecision: "add" | "retire" | "hold", one line why
    decision.predicted                                         # {engine count: predicted seconds per step}

The model is the sizer's (orchestrator/sizing): the run's timed rows, grouped by the engine count that generated them
(`engines/active`; the last WINDOW_STEPS steps, orchestrator/placement/elastic_pool.py), are fitted into a Workload (generate ~ rollout GPUs: one measured size assumes ideal scaling,
two or more fit the serial part too; orchestrator/sizing/scaling.py `fit_law`), and each reachable engine count is
simulated (`evaluate`, the same as `rl-orch size`). With one measured size the prediction is the sizer's prior; every
change measures another size, so a change that did not pay (engines that share a host's cores, a trainer-bound step)
is seen in the next fit and undone by the next decision.

Rules, bounded so the pool does not flap:
- decide only after `sizing.cooldown_steps` rows at the current count (the first of them is dropped as warm-up, as
  the sizer does), and at `sizing.warmup_steps` at the earliest;
- add one engine when the count is below the maximum (rollout.max_workers), the cluster has room for its placement
  group, and one more engine is predicted at least ADD_GAIN faster per step;
- retire one when the count is above the minimum (rollout.min_workers) and one fewer is predicted at most RETIRE_LOSS
  slower (a trainer-bound run gives its rollout devices back), or when the count is above the maximum;
- otherwise hold. ADD_GAIN > RETIRE_LOSS: an engine added is not retired on the same prediction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.placement.config import engine_range
from orchestrator.rollout.modes import ONE_STEP_OFF, STREAM, mode_kind
from orchestrator.sizing.measurements import MeasurementError, fit_workload, measure_rows, role_gpus, timed_rows
from orchestrator.sizing.workload import Split, evaluate

ADD_GAIN = 0.05  # add an engine when predicted at least 5% faster per step
RETIRE_LOSS = 0.02  # retire one when predicted at most 2% slower per step
ENGINES_KEY = "engines/active"  # the row's engine count, at the end of the step (a step that lost one is not fitted)
# the decision fits the last this many steps: a long run's response lengths and phase times drift, and older steps
# would outweigh the recent ones (and reading every row each step would grow with the run)
WINDOW_STEPS = 64
# rows of steps that lost an engine (replaced, or left the job) are left out of the fit
RECOVERY_KEYS = ("rollout/worker_restarts", "sync/engine_restarts")


@dataclass
class PoolDecision:
    """One decision: `action` ("add" | "retire" | "hold"), the engine count it was made at, one line saying why, and
    the predicted seconds per step of each engine count considered ({} when nothing was predicted); `wants_room`: an
    engine more would pay but the cluster has no room for its group."""

    action: str
    engines: int
    why: str
    predicted: dict[int, float] = field(default_factory=dict)
    wants_room: bool = False  # held only for lack of room: the autoscaler is asked for one more engine's group


def steps_at_count(rows: list[dict], engines: int) -> int:
    """Rows at the end of `rows` (in order) whose `engines/active` is `engines`: the steps measured since the last
    change of the count."""
    n = 0
    for row in reversed(rows):
        if row.get(ENGINES_KEY) != engines:
            break
        n += 1
    return n


def predict_counts(rows: list[dict], cfg, counts: list[int]) -> tuple[dict[int, float], list[str]]:
    """({engine count: predicted seconds per step} for `counts`, the fit's notes) from the timed `rows` of a run
    (`cfg`), grouped by `engines/active`: simulated as the sizer's "disaggregated" (rollout.mode sync; a colocated
    run's steps too: generate, reward and reference, train and sync in sequence, the sleep and wake inside the measured
    train and sync phases, added engines beside the shared devices), "async" (one_step_off, at algo.max_staleness: a
    one-step-off row's generation is `async/generate_s`, the generation that ran during the step, on the step's
    engines) or "stream" (rollout.mode=stream: a stream row's generation is its engines' busy seconds, the sizer's
    reading of stream rows). Raises MeasurementError (no timed row) and ValueError (the sizer cannot fit them)."""
    gpus, extra = role_gpus(cfg)
    tp = cfg.rollout.tensor_parallel_size
    by_count: dict[int, list[dict]] = {}
    for row in timed_rows(rows, "placement.elastic: the run's rows"):
        if any(row.get(k) for k in RECOVERY_KEYS):
            continue  # a step that lost an engine timed its recovery, not the count's steady state
        if isinstance(row.get(ENGINES_KEY), int):
            by_count.setdefault(row[ENGINES_KEY], []).append(row)
    if not by_count:
        raise MeasurementError(f"placement.elastic: no timed row has {ENGINES_KEY}")
    runs = [measure_rows(rs, {**gpus, "rollout": n * tp}, f"steps at {n} engines", "the run's rows", extra)
            for n, rs in sorted(by_count.items())]
    # one_step_off: generation beside training; stream: continuous generation, at most k versions stale
    mode = {ONE_STEP_OFF: "async", STREAM: "stream"}.get(mode_kind(cfg), "disaggregated")
    workload, notes = fit_workload(runs, rollout_unit=tp, variation=False, staleness=int(cfg.algo.max_staleness))
    return {n: evaluate(workload, Split(mode, n * tp, gpus["trainer"], gpus["reference"])).step_s
            for n in counts}, notes


def decide_pool(rows: list[dict], cfg, engines: int, room: bool) -> PoolDecision:
    """The decision for a run of config `cfg` (placement.elastic) now at `engines` engines, from its metrics `rows`
    (the current step's last) and whether the cluster has room for one more engine's group (`room`). See the module
    docstring for the rules. Never raises for rows the sizer cannot use: it holds and says why."""
    lo, hi = engine_range(cfg)
    cooldown = cfg.sizing.cooldown_steps
    last = rows[-1].get("step", 0) if rows else 0
    if engines > hi:
        return PoolDecision("retire", engines, f"placement.elastic: retiring an engine: {engines} engines is above "
                                               f"rollout.max_workers={hi}")
    measured = steps_at_count(rows, engines)
    if last < cfg.sizing.warmup_steps or measured < cooldown:
        return PoolDecision("hold", engines, f"placement.elastic: holding {engines} engines: {measured} step(s) "
                                             f"measured at this count (deciding after sizing.cooldown_steps={cooldown}"
                                             f" and step sizing.warmup_steps={cfg.sizing.warmup_steps})")
    counts = [n for n in (engines - 1, engines, engines + 1) if lo <= n <= hi or n == engines]
    try:
        predicted, _ = predict_counts(rows, cfg, counts)
    except ValueError as e:  # MeasurementError, SizingError, FitError
        return PoolDecision("hold", engines, f"placement.elastic: holding {engines} engines: the sizer cannot "
                                             f"model this run: {e}")
    now = predicted[engines]
    more, fewer = predicted.get(engines + 1), predicted.get(engines - 1)
    if more is not None and more <= now * (1 - ADD_GAIN):
        if room:
            return PoolDecision("add", engines, f"placement.elastic: adding an engine: {engines + 1} engines predicted "
                                                f"{more:.3g} s per step against {now:.3g} s at {engines}", predicted)
        return PoolDecision("hold", engines, f"placement.elastic: holding {engines} engines: {engines + 1} are "
                                             f"predicted {more:.3g} s per step (now {now:.3g} s) but the cluster has no "
                                             "room for another engine's placement group (asking Ray's autoscaler "
                                             "for it)", predicted, wants_room=True)
    if fewer is not None and fewer <= now * (1 + RETIRE_LOSS):
        why = (f"within {RETIRE_LOSS:.0%}: the step is not rollout-bound" if fewer >= now else
               "faster: the engines compete for what they share, or the step is not rollout-bound")
        return PoolDecision("retire", engines, f"placement.elastic: retiring an engine: {engines - 1} engines predicted "
                                               f"{fewer:.3g} s per step against {now:.3g} s at {engines} ({why})",
                            predicted)
    return PoolDecision("hold", engines, f"placement.elastic: holding {engines} engines: predicted {now:.3g} s per "
                                         f"step; {_others(predicted, engines)}", predicted)


def _others(predicted: dict[int, float], engines: int) -> str:
    """"N engines X s" of the other counts considered, or a note that none is in range."""
    others = [f"{n} engines {s:.3g} s" for n, s in sorted(predicted.items()) if n != engines]
    return ", ".join(others) + f" (add below -{ADD_GAIN:.0%}, retire within +{RETIRE_LOSS:.0%})" if others else \
        "no other count within rollout.min_workers .. rollout.max_workers"
