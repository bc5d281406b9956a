"""The sizer's recommendation from measured runs, as `rl-orch size` and placement.auto use it (pure).

    sizing, workload, notes = recommend(runs, total_gpus, modes)   # fit the runs, search the splits
    print(format_sizing(sizing, workload, modes))                  # recommendation, runner-ups, equal split
    for line in sizing_warnings(runs, sizing, workload): print(line)

`recommend` fits a scaling law per role to the runs' phase times (orchestrator.sizing.measurements), then
searches the splits with the pipeline simulator (orchestrator.sizing.sizer). The text names the config keys
of the recommended mode (`config_keys`); for stream mode (fully asynchronous, partial rollouts) it gives the k
chosen (the smallest within the workload's k_tolerance of the best k, orchestrator.sizing.stream_sim), every
k's step time and why a larger k does or does not help (`k_lines`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from orchestrator.sizing.measurements import RunMeasurement, fit_workload
from orchestrator.sizing.simulator import MODES
from orchestrator.sizing.stream_sim import overlap_limit_s
from orchestrator.sizing.sizer import Candidate, Sizing, equal_split, fewest_gpus, size
from orchestrator.sizing.workload import Workload, all_splits, evaluate

MODE_WORDS = {"colocated": "colocated (roles time-slice the same GPUs)",
              "disaggregated": "disaggregated, synchronous",
              "async": "disaggregated, async (rollouts of step k+1 overlap training of step k)",
              "stream": "fully asynchronous, partial rollouts (generation never waits for a weight sync)"}


def config_keys(c: Candidate, w: Workload) -> str:
    """The config overrides that select the candidate's mode, e.g. 'placement.mode=disaggregated rollout.mode=stream
    algo.max_staleness=2' (stream: k from the simulation)."""
    if c.split.mode in ("colocated", "disaggregated"):
        return f"placement.mode={c.split.mode} rollout.mode=sync"
    if c.split.mode == "async":
        return f"placement.mode=disaggregated rollout.mode=one_step_off algo.max_staleness={w.staleness}"
    return f"placement.mode=disaggregated rollout.mode=stream algo.max_staleness={c.result.k}"


def _label(c: Candidate, w: Workload) -> str:
    return c.split.describe(w) + (f", k = {c.result.k}" if c.split.mode == "stream" else "")


def k_lines(c: Candidate, w: Workload) -> list[str]:
    """Stream mode: every k's predicted step, and why the k chosen is enough (a larger k only pays when the
    generation time varies from step to step, or when one batch's chain generate -> train -> sync spans
    more than two steps; with constant costs k = 1 reaches the overlap limit, stream_sim's docstring)."""
    r, costs = c.result, w.costs(c.split)
    limit = overlap_limit_s(costs, w.reference_placement(c.split), w.generate_scale)
    by_k = ", ".join(f"k={k} {s:.4g} s" for k, s in r.step_by_k.items())
    top = max(r.step_by_k)
    rest = f" (k > {top} not simulated: k = {top} reaches that lower bound)" if top < w.max_k else ""
    lines = [f"  step time per k: {by_k}; overlap limit (busiest role's work per step) {limit:.4g} s{rest}"]
    best = min(r.step_by_k.values())
    tol = f"within {w.k_tolerance:.0%} of the best k's {best:.4g} s"
    varies = "the generation time varies from step to step" if w.generate_scale else ""
    if r.k == 1:
        why = ("the measured step-to-step variation of the generation time is small enough for k = 1 to absorb"
               if varies else "with the same generation time every step, k = 1 already reaches the overlap limit")
        lines.append(f"  k = 1 is enough ({tol}): {why}; a larger k only helps when generation time varies "
                     "from step to step or has a long tail, and would admit older samples")
    else:
        one = r.step_by_k[1]
        cause = varies or "one batch's generate -> reward -> train -> sync chain spans more than two steps"
        lines.append(f"  k = {r.k}: {cause}, and the batches generated ahead absorb it: k = 1 would take "
                     f"{one:.4g} s (+{one / r.step_s - 1:.1%}); the smallest k {tol}")
    return lines


def _utilisation(c: Candidate, w: Workload) -> str:
    res = c.result
    if c.split.mode == "colocated":
        kinds = ["generate", "reference", "train", "sync", "switch_a", "switch_b"]
        share = {k: res.phase_share(k) for k in kinds}
        share["switch"] = share.pop("switch_a") + share.pop("switch_b")
        parts = [f"{k} {v:.0%}" for k, v in share.items() if v > 0 and (k != "reference" or w.reference)]
        return (f"shared GPUs {res.busy.get('gpus', 0):.0%} busy ({', '.join(parts)}), "
                f"reward CPU {res.busy.get('cpu', 0):.0%}")
    parts = [f"rollout GPUs {res.busy.get('rollout', 0):.0%}", f"trainer GPUs {res.busy.get('trainer', 0):.0%}"]
    if "reference" in res.busy:
        parts.append(f"reference GPUs {res.busy['reference']:.0%}")
    return ", ".join(parts) + f", reward CPU {res.busy.get('cpu', 0):.0%}"


def format_sizing(s: Sizing, w: Workload, modes: tuple[str, ...], top: int = 3) -> str:
    """The recommendation, runner-ups, the equal-split comparison and the search effort, as text."""
    b = s.best
    mode = MODE_WORDS[b.split.mode] + {"async": f", staleness {w.staleness}",
                                       "stream": f", k = {b.result.k}"}.get(b.split.mode, "")
    lines = [f"recommendation for {s.total} GPUs: {_label(b, w)}", f"  mode: {mode}",
             f"  config: {config_keys(b, w)}",
             f"  predicted step time: {b.step_s:.4g} s", f"  utilisation: {_utilisation(b, w)}"]
    if b.result.max_staleness:
        lines.append(f"  samples at most {b.result.max_staleness} weight version(s) old")
    if b.split.mode == "stream":
        lines += k_lines(b, w)
    ups = s.runner_ups(top)
    if ups:
        lines.append("runner-ups:")
        lines += [f"  {c.step_s:10.4g} s  (+{c.step_s / b.step_s - 1:.1%})  {_label(c, w)}" for c in ups]
    eq = equal_split(w, s.total, b.split.mode)
    if eq is not None and (eq.mode in modes):
        e = evaluate(w, eq).step_s
        lines.append(f"equal split ({eq.describe(w)}): {e:.4g} s -> the recommendation is {e / b.step_s:.2f}x "
                     "as fast")
    space = sum(1 for m in modes if w.min_gpus(m) <= s.total for _ in all_splits(w, s.total, m))
    lines.append(f"searched: {s.simulations} splits simulated of {space} valid ones")
    return "\n".join(lines)


def recommend(runs: list[RunMeasurement], total: int, modes: tuple[str, ...] = MODES, *, switch_s: float = 0.0,
              rollout_unit: Optional[int] = None, trainer_unit: int = 1, reference_unit: int = 1,
              staleness: Optional[int] = None, target_step_s: Optional[float] = None,
              adjust: Optional[Callable[[Workload, list[str]], Workload]] = None, max_k: int = 4,
              recompute_s: float = 0.0, variation: bool = True) -> tuple[Sizing, Workload, list[str]]:
    """Fit the runs' workload (orchestrator.sizing.measurements.fit_workload; `variation`: replay the measured
    step-to-step generate times), set stream mode's largest k tried (`max_k`) and the re-prefill seconds of
    an interrupting sync (`recompute_s`), optionally `adjust` it (e.g. the cost model's sync), then search the splits of `total` GPUs in `modes` (sizer.size), or with
    `target_step_s` the fewest GPUs up to `total` meeting it (sizer.fewest_gpus). Returns (sizing, workload,
    notes on how each law was obtained). Raises MeasurementError / SizingError / FitError (ValueErrors) on
    bad input; used by `rl-orch size` and by placement.auto (orchestrator/placement/replace.py)."""
    w, notes = fit_workload(runs, switch_s=switch_s, rollout_unit=rollout_unit, trainer_unit=trainer_unit,
                            reference_unit=reference_unit, staleness=staleness, variation=variation)
    w = dataclasses.replace(w, max_k=max_k, recompute_s=recompute_s)
    if adjust is not None:
        w = adjust(w, notes)
    if target_step_s is not None:
        return fewest_gpus(w, target_step_s, total, modes), w, notes
    return size(w, total, modes), w, notes


def sizing_warnings(runs: list[RunMeasurement], s: Sizing, w: Workload) -> list[str]:
    """What makes the recommendation less trustworthy: missing phases, far extrapolation, a sync-bound step."""
    out = []
    for r in runs:
        missing = [k for k in ("generate", "train", "sync") if k not in r.phases]
        if missing:
            out.append(f"warning: {r.path} has no timing for {', '.join(missing)}: counted as 0 s")
    measured = max(sum(r.gpus.values()) for r in runs)
    if s.total > 16 * measured:
        out.append(f"warning: the laws were fitted on runs of at most {measured} GPU(s) and are extrapolated to "
                   f"{s.total}: measure at a larger size before trusting this split")
    costs = w.costs(s.best.split)
    if costs.sync_s > max(costs.generate_s, costs.train_s):
        out.append(f"warning: sync-bound: weight sync ({costs.sync_s:.3g} s) outweighs generate "
                   f"({costs.generate_s:.3g} s) and train ({costs.train_s:.3g} s), so the split matters little; "
                   "see `rl-orch plan sync` for a faster weight_sync.strategy")
    return out
