"""The check "a number that must be finite and >= 0" (seconds, tolerances, latencies), written once.

    check_finite_nonnegative(costs)                                       # every dataclass field of `costs`
    check_finite_nonnegative(workload, ("k_tolerance", "recompute_s"), SizingError)
    why = nonnegative_problem(x)    # None, or "must be a finite number >= 0 (got -1.0)" for a caller's own error

Pure (standard library only): sizing, memory and the pure parts of weight_sync import it without a cycle and
without Ray or vLLM (tests/unit/test_import_rule.py).
"""
from __future__ import annotations

import math
from dataclasses import fields
from typing import Iterable, Optional


def nonnegative_problem(value: object) -> Optional[str]:
    """None when `value` is an int or float that is finite and >= 0 (a bool is refused), else the text
    "must be a finite number >= 0 (got <repr of value>)"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return f"must be a finite number >= 0 (got {value!r})"
    return None


def check_finite_nonnegative(obj: object, names: Optional[Iterable[str]] = None,
                             error: type[Exception] = ValueError) -> None:
    """Check the attributes `names` of `obj` (default: every field of the dataclass `obj`), in order.

    Raises `error` (a one-argument exception class, ValueError unless given) for the first attribute that is not
    a finite number >= 0, with the message "<class>.<attribute>: must be a finite number >= 0 (got <value>)",
    e.g. "StepCosts.train_s: must be a finite number >= 0 (got -1.0)"."""
    for name in names if names is not None else [f.name for f in fields(obj)]:  # type: ignore[arg-type]
        why = nonnegative_problem(getattr(obj, name))
        if why is not None:
            raise error(f"{type(obj).__name__}.{name}: {why}")
