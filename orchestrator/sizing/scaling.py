"""Scaling laws: seconds of one phase of one step as a function of the GPUs its role holds.

Pure Python (no Ray, vLLM or torch). One law for every role:

    t(g) = a + b * g ** (-alpha)        g = GPUs of the role, t in seconds per step

- rollout (generate): alpha = 1 fixed. Replicas split the step's prompts, so the parallel part b/g is
  exact (Amdahl's law, Amdahl 1967); a >= 0 is what does not shrink with more engines (the longest
  sequence's decode, request dispatch).
- trainer (train) and reference: alpha free in [0, ALPHA_MAX]. Data-parallel (FSDP) steps scale
  sub-linearly because the all-gather / reduce-scatter volume per GPU does not shrink with g; the power
  law b / g**alpha with alpha < 1 is the usual empirical fit of strong scaling (e.g. Narayanan et al.
  2021, "Efficient large-scale language model training on GPU clusters", fig. 15).
- weight sync: alpha = -1 fixed, t = a + b * g: a pipelined ring broadcast costs the same for any
  receiver count (orchestrator/weight_sync/cost_model.py, `_predict_nccl`); b >= 0 takes up what grows with
  the receivers (the ring fill, a shared filesystem's read rate).

`fit_law` fits a law to measurements at one or more sizes, minimising the squared *relative* error
sum(((t_model(g_i) - t_i) / t_i) ** 2) with a, b >= 0. With a single size it cannot separate a, b and
alpha: it falls back to DEFAULT_ALPHA with no serial part (the whole time scales), and says so in
`Law.note`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Exponents assumed when a role was measured at one size only (documented guesses, not measurements):
# rollout replicas are independent (1.0); FSDP data parallelism loses ~10% per doubling (0.9);
# the sync is taken as independent of the receiver count (see the module docstring).
DEFAULT_ALPHA: dict[str, float] = {"rollout": 1.0, "trainer": 0.9, "reference": 0.9, "sync": -1.0}
# Exponent fixed by the physics of the role, whatever the number of sizes measured (None = fitted).
FIXED_ALPHA: dict[str, float | None] = {"rollout": 1.0, "trainer": None, "reference": None, "sync": -1.0}
ALPHA_MAX: float = 1.5


class FitError(ValueError):
    """Measurements a law cannot be fitted to (empty, non-positive GPUs or seconds)."""


@dataclass(frozen=True)
class Law:
    """t(g) = a + b * g ** (-alpha) seconds; `note` says how it was obtained (fit or default)."""

    a: float
    b: float
    alpha: float
    note: str = ""

    def __call__(self, gpus: float) -> float:
        """Seconds at `gpus` > 0 GPUs; ValueError for gpus <= 0."""
        if not gpus > 0:
            raise ValueError(f"gpus: must be > 0 (got {gpus})")
        return self.a + self.b * gpus ** (-self.alpha)

    def describe(self) -> str:
        """The law as text, e.g. 't(g) = 2 + 30/g^0.8 s'."""
        if self.alpha == -1.0:
            return f"t(g) = {self.a:.4g} + {self.b:.4g}*g s"
        exp = "" if self.alpha == 1.0 else f"^{self.alpha:.3g}"
        return f"t(g) = {self.a:.4g} + {self.b:.4g}/g{exp} s"


def constant(seconds: float, note: str = "constant") -> Law:
    """A phase that does not depend on the GPU count (a = seconds, b = 0)."""
    return Law(float(seconds), 0.0, 0.0, note)


def _check_points(points: list[tuple[float, float]], what: str) -> list[tuple[float, float]]:
    if not points:
        raise FitError(f"{what}: no measurements to fit")
    out = []
    for g, t in points:
        if not (isinstance(g, (int, float)) and g > 0 and math.isfinite(g)):
            raise FitError(f"{what}: GPU count must be > 0 (got {g!r})")
        if not (isinstance(t, (int, float)) and t >= 0 and math.isfinite(t)):
            raise FitError(f"{what}: seconds must be finite and >= 0 (got {t!r} at {g} GPUs)")
        out.append((float(g), max(float(t), 1e-9)))  # 1e-9: relative errors of a 0 s phase stay finite
    return out


def _nnls_ab(points: list[tuple[float, float]], alpha: float) -> tuple[float, float, float]:
    """(a, b, error): weighted least squares of t = a + b*x, x = g**-alpha, weights 1/t**2, a, b >= 0.

    The 2x2 normal equations; when the free solution has a negative coefficient, the best solution on
    that boundary (one coefficient 0) is the optimum (the problem is convex)."""
    xs = [g ** (-alpha) for g, _ in points]
    ws = [1.0 / t ** 2 for _, t in points]
    ts = [t for _, t in points]
    sw = sum(ws)
    swx = sum(w * x for w, x in zip(ws, xs))
    swxx = sum(w * x * x for w, x in zip(ws, xs))
    swt = sum(w * t for w, t in zip(ws, ts))
    swxt = sum(w * x * t for w, x, t in zip(ws, xs, ts))
    det = sw * swxx - swx * swx
    candidates = [(swt / sw, 0.0), (0.0, swxt / swxx)]
    if det > 1e-12 * sw * swxx:
        a, b = (swxx * swt - swx * swxt) / det, (sw * swxt - swx * swt) / det
        if a >= 0 and b >= 0:
            candidates.append((a, b))

    def err(ab):
        return sum(w * (ab[0] + ab[1] * x - t) ** 2 for w, x, t in zip(ws, xs, ts))

    a, b = min(candidates, key=err)
    return a, b, err((a, b))


def _fit_alpha(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(a, b, alpha) minimising the relative error over alpha in [0, ALPHA_MAX]: a scan in steps of
    0.01, then golden-section refinement around the best grid point (to about 1e-6)."""
    def err(alpha):
        return _nnls_ab(points, alpha)[2]

    grid = [i * 0.01 for i in range(int(ALPHA_MAX * 100) + 1)]
    best = min(grid, key=err)
    lo, hi = max(0.0, best - 0.01), min(ALPHA_MAX, best + 0.01)
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        m1, m2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if err(m1) <= err(m2):
            hi = m2
        else:
            lo = m1
    alpha = (lo + hi) / 2
    a, b, _ = _nnls_ab(points, alpha)
    return a, b, alpha


def fit_law(role: str, points: list[tuple[float, float]]) -> Law:
    """Fit t(g) = a + b * g**-alpha for `role` (rollout | trainer | reference | sync) to measured
    (gpus, seconds) points; points at the same GPU count are averaged.

    One distinct size: a = 0 and alpha = DEFAULT_ALPHA[role] (sync: a = t, b = 0, constant).
    Two distinct sizes with a free exponent (trainer, reference): a = 0, alpha from the two points
    (the power law through both), clamped to [0, ALPHA_MAX]. Otherwise: a, b >= 0 and (when free)
    alpha by relative least squares. Raises FitError for an unknown role or bad points.
    """
    if role not in DEFAULT_ALPHA:
        raise FitError(f"role: expected one of {list(DEFAULT_ALPHA)} (got {role!r})")
    by_size: dict[float, list[float]] = {}
    for g, t in _check_points(points, role):
        by_size.setdefault(g, []).append(t)
    pts = sorted((g, sum(ts) / len(ts)) for g, ts in by_size.items())
    sizes = ", ".join(f"{g:g}" for g, _ in pts)
    if len(pts) == 1:
        g, t = pts[0]
        if role == "sync":
            return Law(t, 0.0, -1.0, f"measured at {sizes} GPUs only: assumed independent of the receiver count")
        alpha = DEFAULT_ALPHA[role]
        return Law(0.0, t * g ** alpha, alpha, f"measured at {g:g} GPUs only: assumed exponent "
                                               f"{alpha:g} and no serial part (measure 2+ sizes to fit them)")
    fixed = FIXED_ALPHA[role]
    if fixed is not None:
        a, b, _ = _nnls_ab(pts, fixed)
        return Law(a, b, fixed, f"fitted to {len(pts)} sizes ({sizes} GPUs), exponent fixed at {fixed:g}")
    if len(pts) == 2:
        (g1, t1), (g2, t2) = pts
        alpha = min(ALPHA_MAX, max(0.0, math.log(t1 / t2) / math.log(g2 / g1)))
        b = math.exp(sum(math.log(t * g ** alpha) for g, t in pts) / 2)  # geometric mean over both points
        return Law(0.0, b, alpha, f"power law through 2 sizes ({sizes} GPUs), no serial part")
    a, b, alpha = _fit_alpha(pts)
    return Law(a, b, alpha, f"fitted to {len(pts)} sizes ({sizes} GPUs)")
