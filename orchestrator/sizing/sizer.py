"""The sizer: the split and mode with the shortest predicted step for a GPU total, or the fewest GPUs for
a target step time. Pure Python.

    result = size(workload, 64)              # Sizing: best, runner_ups, per-mode best, simulations run
    fewest_gpus(workload, target_step_s=20, max_gpus=1024)
    brute_force(workload, 64)                # every split simulated (the reference the tests compare to)

The search (per mode and per reference placement):
1. Analytic balancing: a closed-form proxy of the step time (`proxy_step_s`: the critical chain
   through one step, and in async / stream mode the busiest resource and the chain spread over
   staleness + 1 steps, stream with its largest k, max_k) is minimised over the rollout GPUs by integer ternary search, the reference GPUs by a nested
   one; the trainer takes the rest. The proxy is quasi-convex in each count because every law is
   monotone in its GPUs. O(log^2 U) proxy evaluations for U units.
2. Local search with the simulator around that point: move rollout / reference GPUs by k units
   (k = U/8, U/16, ..., 1; the trainer absorbs the change) while the simulated step gets shorter.
It simulates a few dozen splits where the brute force simulates every one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from orchestrator.sizing.simulator import MODES, SimResult, StepCosts
from orchestrator.sizing.workload import SizingError, Split, Workload, all_splits, evaluate, split_from


@dataclass
class Candidate:
    """A split and its simulated result."""

    split: Split
    result: SimResult

    @property
    def step_s(self) -> float:
        return self.result.step_s


@dataclass
class Sizing:
    """best: the shortest predicted step. per_mode: the best found in each mode searched. ranked: every
    simulated candidate, shortest first. simulations: how many splits were simulated."""

    total: int
    best: Candidate
    per_mode: dict[str, Candidate]
    ranked: list[Candidate] = field(default_factory=list)
    simulations: int = 0

    def runner_ups(self, n: int = 3) -> list[Candidate]:
        """The best of every other mode, then the next-best splits, up to n, best first."""
        out = [c for m, c in self.per_mode.items() if c.split != self.best.split]
        out += [c for c in self.ranked if c.split != self.best.split and c not in out]
        return sorted(out[: max(n, len(self.per_mode) - 1)], key=lambda c: c.step_s)[:n]


def proxy_step_s(mode: str, c: StepCosts, staleness: int, reference: Optional[str]) -> float:
    """Closed-form estimate of the simulated step (seconds): exact for the synchronous modes (the
    critical chain of one step), the largest of the simulator's cycle bounds for async and stream (staleness
    = k there; R = recompute_s, 0 outside stream mode).

    G, W, F, T, S, C, X = generate, reward, reference, train, sync, checkpoint, switch seconds;
    F_own / F_tr = F when the reference has its own GPUs / shares the trainer's, else 0.
    colocated: G + max(X/2 + F, W) + T + S + X/2 + C (all on one resource; reward on the CPU).
    disaggregated: max(G + max(W, F_own), max(G, C) + F_tr, C) + T + S (checkpoint_k overlaps
    generate_{k+1}; the reference on the trainer waits for both).
    async, stream: max((G + max(W, F_own, F_tr) + T + S) / (s + 1), G + S_ro + R, F_tr + T + S_tr + C, W, F_own):
    the chain generate_k -> sync_k -> generate_{k+1+s} spans s + 1 periods; each resource's own work spans one.
    S_tr = S - sync_hidden_s, the sync's trainer part, and S_ro = sync_hidden_s, its engines' part (stream mode with
    weight_sync.overlap: the engines generate during the send; S elsewhere).
    """
    if mode == "colocated":
        return (c.generate_s + max(c.switch_s / 2 + c.reference_s, c.reward_s) + c.train_s + c.sync_s
                + c.switch_s / 2 + c.checkpoint_s)
    own = c.reference_s if reference == "own" else 0.0
    on_trainer = c.reference_s if reference == "trainer" else 0.0
    if mode == "disaggregated":
        pre = max(c.generate_s + max(c.reward_s, own), max(c.generate_s, c.checkpoint_s) + on_trainer)
        return pre + c.train_s + c.sync_s
    chain = c.generate_s + max(c.reward_s, own, on_trainer) + c.train_s + c.sync_s
    return max(chain / (staleness + 1), c.generate_s + c.sync_on_rollout_s + c.recompute_s,
               on_trainer + c.train_s + c.sync_on_trainer_s + c.checkpoint_s, c.reward_s, own)


def _ternary(f: Callable[[int], float], lo: int, hi: int) -> int:
    """argmin of f over the integers lo..hi for a quasi-convex f (ties keep the lower half)."""
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if f(m1) <= f(m2):
            hi = m2
        else:
            lo = m1
    return min(range(lo, hi + 1), key=f)


class _Search:
    """Cached simulation of splits of one total; counts simulations."""

    def __init__(self, workload: Workload, total: int):
        self.w, self.total = workload, total
        self.cache: dict[Split, Candidate] = {}

    def sim(self, split: Optional[Split]) -> Optional[Candidate]:
        if split is None:
            return None
        if split not in self.cache:
            self.cache[split] = Candidate(split, evaluate(self.w, split))
        return self.cache[split]

    def proxy(self, split: Optional[Split]) -> float:
        if split is None:
            return float("inf")
        w = self.w
        k = w.max_k if split.mode == "stream" else w.staleness
        return proxy_step_s(split.mode, w.costs(split), k, w.reference_placement(split))

    def start(self, mode: str, own_reference: bool) -> Optional[Split]:
        """Step 1: the proxy's best split (ternary over rollout units, nested over reference units)."""
        w, n = self.w, self.total
        if mode == "colocated":
            u = w.min_gpus(mode)
            k = _ternary(lambda i: self.proxy(split_from(w, mode, n, i * u)), 1, n // u)
            return split_from(w, mode, n, k * u)
        ru, fu = w.rollout_unit, w.reference_unit

        def best_ref(r_units: int) -> int:
            if not own_reference:
                return 0
            top = (n - r_units * ru - w.trainer_unit) // fu
            return _ternary(lambda j: self.proxy(split_from(w, mode, n, r_units * ru, j * fu)), 1, top) \
                if top >= 1 else 0

        r_max = (n - w.trainer_unit) // ru
        if r_max < 1:
            return None
        r = _ternary(lambda i: self.proxy(split_from(w, mode, n, i * ru, best_ref(i) * fu)), 1, r_max)
        return split_from(w, mode, n, r * ru, best_ref(r) * fu)

    def climb(self, split: Split) -> Candidate:
        """Step 2: hill-climb on the simulated step, moves of k units, k halving down to 1."""
        w, n = self.w, self.total
        best = self.sim(split)
        units = n // (w.min_gpus(split.mode) if split.mode == "colocated" else w.rollout_unit)
        k = max(1, units // 8)
        while True:
            improved = False
            for cand in self._moves(best.split, k):
                c = self.sim(cand)
                if c is not None and c.step_s < best.step_s * (1 - 1e-9):
                    best, improved = c, True
            if not improved:
                if k == 1:
                    return best
                k //= 2

    def _moves(self, s: Split, k: int) -> Iterable[Optional[Split]]:
        w, n = self.w, self.total
        if s.mode == "colocated":
            u = w.min_gpus(s.mode)
            return [split_from(w, s.mode, n, s.rollout + d * k * u) for d in (-1, 1)]
        ru, fu = w.rollout_unit, w.reference_unit
        out = [split_from(w, s.mode, n, s.rollout + d * k * ru, s.reference) for d in (-1, 1)]
        if w.reference is not None:
            for dr in (-1, 0, 1):
                for df in (-1, 1):
                    f = s.reference + df * k * fu
                    if f >= 0:
                        out.append(split_from(w, s.mode, n, s.rollout + dr * k * ru, f))
        return out


def _check_total(workload: Workload, total: int, modes: tuple[str, ...]) -> tuple[str, ...]:
    modes = tuple(modes)
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise SizingError(f"modes: expected a non-empty subset of {list(MODES)} (got {list(modes)})")
    if isinstance(total, bool) or not isinstance(total, int):
        raise SizingError(f"total GPUs: must be an integer (got {total!r})")
    fits = tuple(m for m in modes if workload.min_gpus(m) <= total)
    if not fits:
        need = min(workload.min_gpus(m) for m in modes)
        raise SizingError(f"total GPUs: {total} is fewer than the {need} the smallest split of "
                          f"{'/'.join(modes)} needs (rollout unit {workload.rollout_unit}, trainer unit "
                          f"{workload.trainer_unit})")
    return fits


def size(workload: Workload, total: int, modes: tuple[str, ...] = MODES) -> Sizing:
    """The shortest predicted step over `modes` for `total` GPUs (see the module docstring).

    Raises SizingError when total is below every mode's minimum or modes is invalid."""
    search = _Search(workload, total)
    per_mode: dict[str, Candidate] = {}
    for mode in _check_total(workload, total, modes):
        placements = [False] if mode == "colocated" or workload.reference is None else [False, True]
        for own in placements:
            start = search.start(mode, own)
            if start is None:
                continue
            found = search.climb(start)
            if mode not in per_mode or found.step_s < per_mode[mode].step_s:
                per_mode[mode] = found
    ranked = sorted(search.cache.values(), key=lambda c: c.step_s)
    best = min(per_mode.values(), key=lambda c: c.step_s)
    return Sizing(total, best, per_mode, ranked, len(search.cache))


def brute_force(workload: Workload, total: int, modes: tuple[str, ...] = MODES) -> Sizing:
    """Every split of `all_splits` in every mode simulated; the same result type as `size`."""
    per_mode: dict[str, Candidate] = {}
    ranked = []
    for mode in _check_total(workload, total, modes):
        cands = [Candidate(s, evaluate(workload, s)) for s in all_splits(workload, total, mode)]
        per_mode[mode] = min(cands, key=lambda c: c.step_s)
        ranked += cands
    ranked.sort(key=lambda c: c.step_s)
    return Sizing(total, ranked[0], per_mode, ranked, len(ranked))


def fewest_gpus(workload: Workload, target_step_s: float, max_gpus: int,
                modes: tuple[str, ...] = MODES) -> Sizing:
    """The sizing of the fewest GPUs (<= max_gpus) whose best split meets `target_step_s` seconds.

    Binary search over the total: the best step never grows with more GPUs (every smaller split stays
    available). Raises SizingError naming the best step reachable with max_gpus when it misses the target."""
    if not target_step_s > 0:
        raise SizingError(f"target step: must be > 0 seconds (got {target_step_s!r})")
    top = size(workload, max_gpus, modes)
    if top.best.step_s > target_step_s:
        raise SizingError(f"target step {target_step_s:g} s: not reachable with {max_gpus} GPUs (best "
                          f"{top.best.step_s:.4g} s, {top.best.split.describe(workload)})")
    lo, hi = min(workload.min_gpus(m) for m in modes if m in MODES), max_gpus
    found = top
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            s = size(workload, mid, modes)
        except SizingError:  # below every mode's minimum
            lo = mid + 1
            continue
        if s.best.step_s <= target_step_s:
            hi, found = mid, s
        else:
            lo = mid + 1
    return found


def equal_split(workload: Workload, total: int, mode: str) -> Optional[Split]:
    """Every GPU role gets the same GPUs (rollout, trainer, and the reference when there is one), each
    rounded down to its unit; None when a role gets less than one unit. colocated -> disaggregated."""
    mode = "disaggregated" if mode == "colocated" else mode
    roles = 3 if workload.reference is not None else 2
    share = total // roles
    r = share // workload.rollout_unit * workload.rollout_unit
    f = share // workload.reference_unit * workload.reference_unit if roles == 3 else 0
    t = share // workload.trainer_unit * workload.trainer_unit
    if r < 1 or t < 1 or (roles == 3 and f < 1):
        return None
    return Split(mode, r, t, f)
