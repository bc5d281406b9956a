"""`rollout.mode`: when batches are generated relative to training, resolved once at load into the one value that the
controller, the sizer (orchestrator/placement/replace.py), resume (orchestrator/rollout/resume_mode.py) and the
checks read. `placement.mode` says only where the actors run (colocated | disaggregated).

| rollout.mode | what runs | staleness of a trained token |
|---|---|---|
| `sync` | generate, score, train, sync, in turn (GRPOController.step) | 0 |
| `one_step_off` | step k + 1's batch generates while step k trains (orchestrator/rollout/async_source.py) | <= algo.max_staleness |
| `stream` | the engines generate without pause; a weight update interrupts their requests, which go on with the new weights (partial rollouts, orchestrator/rollout/stream_source.py) | <= algo.max_staleness, counted from a sample's oldest token |

`algo.max_staleness` (k) has one meaning in both asynchronous modes: the largest staleness (the trained policy's
version minus the version that sampled a token) a trained token may have; an older group or batch is dropped and
counted, never trained. A sync run trains at staleness 0 whatever k says.

Deprecated keys, still read (`resolve_rollout_mode` says which new keys to use): `placement.mode=disaggregated_async`
= `placement.mode=disaggregated` with `rollout.mode=one_step_off`, or `rollout.mode=stream` with
`rollout.partial_rollout=true`; `rollout.partial_rollout=true` = `rollout.mode=stream`. The resolved config holds
the new keys only (`placement.mode` never `disaggregated_async`, `rollout.partial_rollout` false: read into
rollout.mode), so a saved config reloads without a warning and takes any rollout.mode override.
Pure: no Ray, no torch.
"""
from __future__ import annotations

from typing import Optional

from orchestrator.rollout.modes import ONE_STEP_OFF, STREAM, SYNC, get, kind_of, mode_kind
ASYNC_PLACEMENT = "disaggregated_async"  # deprecated placement.mode


def _deprecated(placement: str, partial: bool, mode: str) -> Optional[str]:
    old = ([f"placement.mode={ASYNC_PLACEMENT}"] if placement == ASYNC_PLACEMENT else []) + \
          (["rollout.partial_rollout=true"] if partial else [])
    if not old:
        return None
    new = (["placement.mode=disaggregated"] if placement == ASYNC_PLACEMENT else []) + [f"rollout.mode={mode}"]
    return f"config: {' '.join(old)} is deprecated; write {' '.join(new)} (docs/configuration.md, rollout.mode)"


def _mode_of(cfg, placement: str, partial: bool) -> str:
    """rollout.mode as set, or as the deprecated keys say. Raises ValueError naming both keys of a conflict."""
    mode = cfg.rollout.mode
    if mode is not None:
        get(mode)  # a registered mode or a dotted path to one (orchestrator/rollout/modes.py); else ValueError
    if mode is None:
        if partial:
            if placement == "colocated":
                raise ValueError("rollout.partial_rollout=true (deprecated: rollout.mode=stream) needs "
                                 "placement.mode=disaggregated (got 'colocated'): the engines generate while the trainer "
                                 "trains")
            return STREAM
        return ONE_STEP_OFF if placement == ASYNC_PLACEMENT else SYNC
    if partial and kind_of(mode) != STREAM:
        raise ValueError(f"rollout.partial_rollout=true means rollout.mode=stream, but rollout.mode={mode!r}: drop "
                         "rollout.partial_rollout (deprecated)")
    if placement == ASYNC_PLACEMENT and kind_of(mode) == SYNC:
        raise ValueError(f"placement.mode={ASYNC_PLACEMENT} (deprecated) generates one step off, but rollout.mode=sync: "
                         "write placement.mode=disaggregated")
    return mode


def resolve_rollout_mode(cfg) -> Optional[str]:
    """Set `cfg.rollout.mode` (from the deprecated keys when unset), `placement.mode` (disaggregated for
    disaggregated_async) and `rollout.partial_rollout` (false: read into the mode) in place; idempotent. Returns the
    deprecation message naming the new keys when a deprecated key was used, else None.

    Raises ValueError naming both keys: a rollout.mode that is neither a registered mode nor a dotted path to one; rollout.mode against rollout.partial_rollout=true or against
    placement.mode=disaggregated_async; an asynchronous mode with placement.mode=colocated (the engines sleep while
    the trainer trains, so nothing generates beside training); stream with algo.max_staleness < 1."""
    placement, partial = cfg.placement.mode, bool(cfg.rollout.partial_rollout)
    mode = _mode_of(cfg, placement, partial)
    note = _deprecated(placement, partial, mode)
    kind = kind_of(mode)
    if kind != SYNC and placement == "colocated":
        raise ValueError(f"rollout.mode={mode} needs placement.mode=disaggregated (got 'colocated'): colocated engines "
                         "sleep while the trainer trains, so no batch generates beside training")
    if kind == STREAM and cfg.algo.max_staleness == 0:  # below 0: the field's own range check names it
        raise ValueError("rollout.mode=stream needs algo.max_staleness >= 1 (got 0): k is how many policy versions a "
                         "streamed sample may lag the trainer")
    if cfg.rollout.mode != mode:  # written only when it changes: a loaded (read-only) config is resolved already
        cfg.rollout.mode = mode
    if cfg.rollout.partial_rollout:
        cfg.rollout.partial_rollout = False
    if placement == ASYNC_PLACEMENT:
        cfg.placement.mode = "disaggregated"
    return note


def staleness_bound(cfg) -> int:
    """The largest staleness a trained token of resolved config `cfg` may have: 0 in sync mode, else
    algo.max_staleness."""
    return 0 if mode_kind(cfg) == SYNC else int(cfg.algo.max_staleness)

