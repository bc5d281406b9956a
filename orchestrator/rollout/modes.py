"""The rollout-mode registry: the one place that names the values of `rollout.mode` (pure: no Ray, no torch).

    mode = get("one_step_off")          # a RolloutMode: its name, its pipeline builder, the built-in contract it keeps
    mode.kind                           # "sync" | "one_step_off" | "stream"
    pipeline = mode.build()(source, sample, loader, cfg, start_step, score_group, on_poll)

A mode says *when* a step's batch is generated; its pipeline (orchestrator/rollout/pipeline.py `RolloutPipeline`) is
what the controller's one step calls. Built in: `sync`, `one_step_off` and `stream` (where each lives: the table in
orchestrator/rollout/pipeline.py). A fourth mode is one module with a module-level `MODE = RolloutMode(...)`, named in
`rollout.mode` by its dotted path (`get` imports and registers it; no file of ours changes), or registered here by one
`register(...)` line. Its `kind` is the built-in mode whose contract it keeps, which the rest of the system reads
instead of the name: the placement it needs (sync: any; one_step_off and stream generate beside training, so
`placement.mode=disaggregated`), the staleness bound (sync: 0; else algo.max_staleness), the format of the pending
rollouts it checkpoints and which modes resume them (orchestrator/rollout/resume_mode.py), the sizer's model of its
steps (orchestrator/placement/replace.py) and whether the weight sync overlaps the next step (stream). Worked example:
docs/examples/rollout_mode_example.py; the guide: docs/extending.md ("A rollout mode").
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from orchestrator.utils.user_code import import_user_module

SYNC, ONE_STEP_OFF, STREAM = "sync", "one_step_off", "stream"
KINDS = (SYNC, ONE_STEP_OFF, STREAM)


@dataclass(frozen=True)
class RolloutMode:
    """One registry line. name: the value of `rollout.mode`; builder: "pkg.module:function" of the pipeline factory,
    (source, sample, loader, cfg, start_step, score_group, on_poll) -> RolloutPipeline (imported on `build`); kind:
    the built-in mode whose contract it keeps (see the module docstring). Raises ValueError for another kind."""

    name: str
    builder: str
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rollout mode {self.name!r}: kind={self.kind!r} must be one of {list(KINDS)}")

    def build(self) -> Callable:
        """The pipeline factory; raises ImportError / AttributeError naming the builder."""
        module, _, attr = self.builder.partition(":")
        factory = getattr(importlib.import_module(module), attr, None)
        if not callable(factory):
            raise AttributeError(f"rollout mode {self.name!r}: {self.builder} is not a callable")
        return factory


_REGISTRY: dict[str, RolloutMode] = {}


def register(mode: RolloutMode) -> RolloutMode:
    """Add (or replace) `mode`; returns it."""
    _REGISTRY[mode.name] = mode
    return mode


register(RolloutMode(SYNC, "orchestrator.rollout.pipeline:build_sync", SYNC))
register(RolloutMode(ONE_STEP_OFF, "orchestrator.rollout.pipeline:build_one_step_off", ONE_STEP_OFF))
register(RolloutMode(STREAM, "orchestrator.rollout.pipeline:build_stream", STREAM))


def mode_names() -> tuple[str, ...]:
    """Every registered mode, built-ins first."""
    return tuple(_REGISTRY)


def get(name: str) -> RolloutMode:
    """The mode `name`: a registered name, or a dotted module path `pkg.module` whose module defines `MODE` (a
    RolloutMode, registered under the path on first use, its builder imported then). Raises ValueError naming
    `rollout.mode` and what is wrong: not a registered name, a module that cannot be imported (or raises while it
    is), no `MODE` or one of another type, a builder that is not a callable."""
    if name not in _REGISTRY and isinstance(name, str) and "." in name:
        register(_from_module(name))
    if name not in _REGISTRY:
        raise ValueError(f"rollout.mode={name!r} is not allowed; choose one of {list(KINDS)}, or a dotted path "
                         "pkg.module to a module with MODE")
    return _REGISTRY[name]


def _from_module(path: str) -> RolloutMode:
    """The RolloutMode of module `path` (its `MODE`), under the name `path`, its builder checked."""
    module = import_user_module(path, f"rollout.mode={path!r}")
    mode = getattr(module, "MODE", None)
    if not isinstance(mode, RolloutMode):
        what = "defines no MODE" if mode is None else f"defines MODE = {mode!r}, not a RolloutMode"
        raise ValueError(f"rollout.mode={path!r}: the module {what} (orchestrator.rollout.modes.RolloutMode; "
                         "docs/extending.md, \"A rollout mode\")")
    mode = RolloutMode(path, mode.builder, mode.kind)
    try:
        mode.build()
    except Exception as e:  # noqa: BLE001 - a typo in the builder path: said now, not after the actors start
        raise ValueError(f"rollout.mode={path!r}: its MODE.builder={mode.builder!r} is not a callable "
                         f"({type(e).__name__}: {e})") from None
    return mode


def mode_kind(cfg) -> str:
    """The kind (SYNC, ONE_STEP_OFF, STREAM) of run config `cfg`'s rollout.mode: itself for a built-in, the `kind` a
    registered or dotted-path mode declares."""
    return kind_of(cfg.rollout.mode)


def kind_of(name: str) -> str:
    """The built-in mode whose contract mode `name` keeps (SYNC, ONE_STEP_OFF or STREAM). Raises what `get` raises."""
    return get(name).kind
