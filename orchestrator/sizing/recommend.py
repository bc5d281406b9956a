"""The sizer's recommendation from measured runs, as `rl-orch size` and placement.auto use it (pure).

    sizing, workload, notes = recommend(runs, total_gpus, modes)   # fit the runs, search the splits
    print(format_sizing(sizing, workload, modes))                  # recommendation, runner-ups, equal split
    for line in sizing_warnings(runs, sizing, workload): print(line)

`recommend` fits a scaling law per role to the runs' phase times (orchestrator.sizing.measurements), then
searches the splits with the pipeline simulator (orchestrator.sizing.sizer).
"""
from __future__ import annotations

from typing import Callable, Optional

from orchestrator.sizing.measurements import RunMeasurement, fit_workload
from orchestrator.sizing.simulator import MODES
from orchestrator.sizing.sizer import Candidate, Sizing, equal_split, fewest_gpus, size
from orchestrator.sizing.workload import Workload, all_splits, evaluate

MODE_WORDS = {"colocated": "colocated (roles time-slice the same GPUs)",
              "disaggregated": "disaggregated, synchronous",
              "async": "disaggregated, async (rollouts of step k+1 overlap training of step k)"}


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
    mode = MODE_WORDS[b.split.mode] + (f", staleness {w.staleness}" if b.split.mode == "async" else "")
    lines = [f"recommendation for {s.total} GPUs: {b.split.describe(w)}", f"  mode: {mode}",
             f"  predicted step time: {b.step_s:.4g} s", f"  utilisation: {_utilisation(b, w)}"]
    if b.result.max_staleness:
        lines.append(f"  samples at most {b.result.max_staleness} weight version(s) old")
    ups = s.runner_ups(top)
    if ups:
        lines.append("runner-ups:")
        lines += [f"  {c.step_s:10.4g} s  (+{c.step_s / b.step_s - 1:.1%})  {c.split.describe(w)}" for c in ups]
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
              adjust: Optional[Callable[[Workload, list[str]], Workload]] = None) -> tuple[Sizing, Workload, list[str]]:
    """Fit the runs' workload (orchestrator.sizing.measurements.fit_workload), optionally `adjust` it (e.g. the
    cost model's sync), then search the splits of `total` GPUs in `modes` (sizer.size), or with
    `target_step_s` the fewest GPUs up to `total` meeting it (sizer.fewest_gpus). Returns (sizing, workload,
    notes on how each law was obtained). Raises MeasurementError / SizingError / FitError (ValueErrors) on
    bad input; used by `rl-orch size` and by placement.auto (orchestrator/placement/replace.py)."""
    w, notes = fit_workload(runs, switch_s=switch_s, rollout_unit=rollout_unit, trainer_unit=trainer_unit,
                            reference_unit=reference_unit, staleness=staleness)
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
