"""Config fields that state their allowed values or their range on the field itself, and the check of a
whole config against them (used by orchestrator/config/load.py).

    estimator: str = choice("grpo", ADVANTAGE_ESTIMATORS.names)   # a tuple, or a callable read at check time
    lr: float = number(1e-5, gt=0)                                 # "trainer.lr=-1.0 must be > 0"
    top_p: float = number(1.0, gt=0, le=1)                         # "... must be in (0, 1]"
    tis_cap: Optional[float] = number(2.0, ge=1, optional=True)    # "... must be >= 1 or null"

`check_fields(cfg, Config)` walks the schema's dataclasses alongside the loaded values and raises ValueError
naming the first offending key path with what is allowed. `field_choices(Config)` lists every choice field
as {key path: allowed values} (the configuration reference and its tests read it).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterator, Optional, Union

Allowed = Union[tuple, Callable[[], tuple]]


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of a numeric field: gt/ge below, lt/le above (None = unbounded); `finite` rejects NaN and inf
    (an unbounded side then still must be finite); `optional` allows null; `note` ends the message."""

    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    finite: bool = False
    optional: bool = False
    note: str = ""

    def holds(self, x) -> bool:
        if x is None:
            return self.optional
        ok = ((self.gt is None or x > self.gt) and (self.ge is None or x >= self.ge)
              and (self.lt is None or x < self.lt) and (self.le is None or x <= self.le))
        return ok and (not self.finite or math.isfinite(x))

    def describe(self) -> str:
        lo, hi = (self.gt if self.gt is not None else self.ge), (self.lt if self.lt is not None else self.le)
        if lo is not None and hi is not None:
            text = (f"must be {'a finite number ' if self.finite else ''}in {'(' if self.gt is not None else '['}"
                    f"{lo:g}, {hi:g}{')' if self.lt is not None else ']'}")
        elif lo is not None:
            text = f"must be {'a finite number ' if self.finite else ''}{'>' if self.gt is not None else '>='} {lo:g}"
        elif hi is not None:
            text = f"must be {'<' if self.lt is not None else '<='} {hi:g}"
        else:
            text = "must be finite"
        return text + (" or null" if self.optional else "") + (f" {self.note}" if self.note else "")


def choice(default: Any, allowed: Allowed) -> Any:
    """A field whose value must be one of `allowed`: a tuple, or a callable returning one (a registry's names,
    read when the config is checked, so that a name registered by a plugin counts)."""
    return dataclasses.field(default=default, metadata={"choices": allowed})


def number(default: Any, *, gt=None, ge=None, lt=None, le=None, finite: bool = False, optional: bool = False,
           note: str = "") -> Any:
    """A numeric field with its range (see `Range`)."""
    return dataclasses.field(default=default, metadata={"range": Range(gt, ge, lt, le, finite, optional, note)})


def allowed_values(allowed: Allowed) -> tuple:
    return tuple(allowed() if callable(allowed) else allowed)


def _walk(schema: type, prefix: str = "") -> Iterator[tuple[str, tuple[str, ...], dataclasses.Field, type]]:
    """(key path, attribute path, field, its resolved type) of every field, nested sections included."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        yield key, tuple(key.split(".")), f, hint
        if dataclasses.is_dataclass(hint):
            yield from _walk(hint, f"{key}.")


def check_fields(cfg, schema: type) -> None:
    """Check every choice and range field of `cfg` (a loaded config of `schema`), and that every number is finite
    (NaN and +-inf are refused in any numeric field or list of numbers, with a range or without). Raises ValueError
    naming the key path and the allowed values or the range, e.g. "algo.kl_coef=-0.1 must be a finite number >= 0",
    "trainer.lr=inf must be a finite number in (0, 1]", "trainer.betas[1]=nan must be a finite number"."""
    for key, path, f, hint in _walk(schema):
        if dataclasses.is_dataclass(hint):
            continue
        value = cfg
        for part in path:
            value = getattr(value, part)
        _check_finite(key, value, f.metadata.get("range"))
        if "choices" in f.metadata:
            allowed = allowed_values(f.metadata["choices"])
            if value not in allowed:
                raise ValueError(f"{key}={value!r} is not allowed; choose one of {list(allowed)}")
        elif "range" in f.metadata and not f.metadata["range"].holds(value):
            raise ValueError(f"{key}={value!r} {f.metadata['range'].describe()}")


def _check_finite(key: str, value, bounds: Optional[Range]) -> None:
    """Raise ValueError when `value` (a number, or a list of them) holds NaN or an infinity."""
    items = [(key, value)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    for name, x in items:
        if isinstance(x, float) and not math.isfinite(x):
            what = dataclasses.replace(bounds, finite=True).describe() if bounds else "must be a finite number"
            raise ValueError(f"{name}={x!r} {what}")


def field_choices(schema: type) -> dict[str, Allowed]:
    """{key path: allowed values (tuple or callable)} of every choice field of `schema`."""
    return {key: f.metadata["choices"] for key, _, f, _ in _walk(schema) if "choices" in f.metadata}


def field_ranges(schema: type) -> dict[str, Range]:
    """{key path: Range} of every range field of `schema`."""
    return {key: f.metadata["range"] for key, _, f, _ in _walk(schema) if "range" in f.metadata}


class ChoicesView(Mapping):
    """{key path: allowed values} whose callable entries (registries) are read at each lookup."""

    def __init__(self, entries: dict[str, Allowed]):
        self._entries = dict(entries)

    def __getitem__(self, key: str) -> tuple:
        return allowed_values(self._entries[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
