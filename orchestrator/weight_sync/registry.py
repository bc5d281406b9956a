"""The weight-sync strategy registry: the one place that names the strategies (pure: no Ray, no vLLM).

Each line maps a strategy name to the module holding its sender, its receiver and its description
(`STRATEGY`, an `actors.weight_sync.base.WeightSyncStrategy`) and to its cost-model predictor. The
config's allowed `weight_sync.strategy` values, `auto`'s candidates and `rl-orch plan sync` read it:

    strategy_names()                  # ("nccl", "disk", "delta", "object_store", ...)
    predict_sync(setup)["disk"]       # SyncEstimate of every strategy with a predictor
    get("disk").load()                # the strategy object (imports its module: torch, maybe Ray)

A new strategy is one module plus one `register(...)` line below; or, with no file of ours, its dotted
module path as `weight_sync.strategy` (`get` imports and registers it; docs/extending_weight_sync.md). The module is imported only by `StrategyEntry.load`, so this
file stays importable without Ray or torch.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from orchestrator.utils.user_code import import_user_module
from orchestrator.weight_sync.cost_model import (SyncEstimate, SyncSetup, predict_delta, predict_disk, predict_nccl,
                                                 predict_object_store)

Predictor = Callable[[SyncSetup], SyncEstimate]


@dataclass(frozen=True)
class StrategyEntry:
    """One registry line. `module`: dotted path of a module with a module-level `STRATEGY` object;
    `predict`: the cost model's predictor (None: never chosen by `auto`, absent from `plan sync`)."""

    name: str
    module: str
    predict: Optional[Predictor] = None
    outside_ray: bool = False  # its receiver needs no Ray in the engine's process (rollout.engine=async_llm)
    placement_modes: tuple[str, ...] = ()  # the placement.mode values it works in (empty: any)
    max_engine_gpus: int = 0  # the most GPUs all engines together may hold (0: any)

    def load(self) -> Any:
        """The strategy object `<module>.STRATEGY`; raises ImportError / AttributeError naming the module."""
        strategy = getattr(importlib.import_module(self.module), "STRATEGY", None)
        if strategy is None:
            raise AttributeError(f"weight-sync strategy {self.name!r}: module {self.module} defines no STRATEGY")
        return strategy


_REGISTRY: dict[str, StrategyEntry] = {}


def register(name: str, module: str, predict: Optional[Predictor] = None, outside_ray: bool = False,
             placement_modes: tuple[str, ...] = (), max_engine_gpus: int = 0) -> StrategyEntry:
    """Add (or replace) strategy `name`; returns its entry. `outside_ray`: its receiver runs in a process that is
    no Ray worker (vLLM's AsyncLLM engine core); `placement_modes`: the placement.mode values it works in (empty:
    any); `max_engine_gpus`: the most GPUs its engines may hold together (0: any). Raises ValueError for "auto" or an
    empty name."""
    if not name or name == "auto":
        raise ValueError(f"weight-sync strategy name {name!r}: must be non-empty and not 'auto'")
    _REGISTRY[name] = StrategyEntry(name, module, predict, outside_ray, tuple(placement_modes), max_engine_gpus)
    return _REGISTRY[name]


register("nccl", "actors.weight_sync.collective", predict_nccl)
register("disk", "actors.weight_sync.disk", predict_disk, outside_ray=True)
register("delta", "actors.weight_sync.delta", predict_delta)
register("object_store", "actors.weight_sync.object_store", predict_object_store, outside_ray=True)
# vLLM's own engines (GPU only); no predictors until measured on GPUs, so `auto` never picks them. NCCL refuses two
# ranks of one group on one GPU: engines apart from the trainer. CUDA IPC: the trainer's rank 0 shares one GPU's
# copy, so one engine on that GPU.
register("vllm_nccl", "actors.weight_sync.vllm_nccl", outside_ray=True,
         placement_modes=("disaggregated", "disaggregated_async"))
register("vllm_ipc", "actors.weight_sync.vllm_ipc", outside_ray=True, placement_modes=("colocated",),
         max_engine_gpus=1)


def unregister(name: str) -> None:
    """Remove strategy `name` (tests restore the registry this way); an unknown name is a no-op."""
    _REGISTRY.pop(name, None)


def outside_ray_names() -> tuple[str, ...]:
    """The registered strategies whose receiver runs outside Ray (rollout.engine=async_llm takes only these)."""
    return tuple(n for n, e in _REGISTRY.items() if e.outside_ray)


def strategy_names() -> tuple[str, ...]:
    """Every registered strategy, in registration order (the config also accepts "auto")."""
    return tuple(_REGISTRY)


def entry_of(strategy: "StrategyEntry | str") -> StrategyEntry:
    """The entry of `strategy`: an entry as it is, or a name resolved by `get` (ValueError names the registered)."""
    return get(strategy) if isinstance(strategy, str) else strategy


def priced_names() -> tuple[str, ...]:
    """The registered strategies with a cost-model predictor (`auto`'s candidates, `plan sync`'s rows)."""
    return tuple(n for n, e in _REGISTRY.items() if e.predict is not None)


def get(name: str) -> StrategyEntry:
    """The entry of `name`: a registered name, or a dotted module path `pkg.module` whose module defines
    `STRATEGY` (and optionally `PREDICT`, its cost-model predictor); such a module is imported and registered
    under its path on first use, so a user's strategy needs no file of ours. Raises ValueError naming
    `weight_sync.strategy` and the allowed values."""
    if name not in _REGISTRY and "." in name:
        module = import_user_module(name, f"weight_sync.strategy={name!r}")
        if not hasattr(module, "STRATEGY"):
            raise ValueError(f"weight_sync.strategy={name!r}: the module defines no STRATEGY "
                             "(an actors.weight_sync.base.WeightSyncStrategy; docs/extending_weight_sync.md)")
        if not all(isinstance(getattr(module.STRATEGY, part, None), type) for part in ("sender", "receiver")):
            raise ValueError(f"weight_sync.strategy={name!r}: STRATEGY = {module.STRATEGY!r} is not a strategy (an "
                             "actors.weight_sync.base.WeightSyncStrategy with its sender and receiver classes; "
                             "docs/extending_weight_sync.md)")
        register(name, name, getattr(module, "PREDICT", None), bool(getattr(module, "OUTSIDE_RAY", False)))
    if name not in _REGISTRY:
        raise ValueError(f"weight_sync.strategy={name!r}: choose one of {sorted(_REGISTRY)} (or auto), or a dotted "
                         "path pkg.module to a module with STRATEGY")
    return _REGISTRY[name]


def predict_sync(setup: SyncSetup) -> dict[str, SyncEstimate]:
    """Predicted cost of every registered strategy that has a predictor, keyed by name (formulas in each
    estimate's notes, see orchestrator/weight_sync/cost_model.py). A predictor shared by two strategies (a
    user's strategy priced as `disk`) reports under each strategy's own name."""
    return {e.name: dataclasses.replace(e.predict(setup), strategy=e.name)
            for e in _REGISTRY.values() if e.predict is not None}


def choose_strategy(setup: SyncSetup, candidates: Optional[tuple[str, ...] | list[str]] = None) -> str:
    """The candidate with the fewest predicted seconds; ties go to the earlier candidate. `candidates`
    defaults to every strategy with a predictor, in registration order.

    Raises ValueError naming `candidates` when it is empty or holds a strategy without a predictor.
    """
    estimates = predict_sync(setup)
    candidates = tuple(estimates) if candidates is None else tuple(candidates)
    unknown = [c for c in candidates if c not in estimates]
    if not candidates or unknown:
        raise ValueError(f"candidates: expected a non-empty subset of {list(estimates)} (got {list(candidates)})")
    return min(candidates, key=lambda c: estimates[c].seconds)
