"""Which rollout mode wrote a checkpoint's pending rollouts (its extra state "async"), and whether a config may
resume them. Checked before any actor starts (GRPOController.__init__), before placement.auto re-places the
actors, and at every restore (where the state the new pipeline loads is chosen).

    pending, note = state_to_load(extra.get("async"), cfg, where="checkpoint runs/x/ckpt/step_000008")
    check_written_by(state, ONE_STEP_OFF, "AsyncRollouts")   # a pipeline's own guard in load_state_dict

Modes (`rollout.mode`, orchestrator/config/rollout_mode.py): STREAM (StreamRollouts,
orchestrator/rollout/stream_source.py), ONE_STEP_OFF (AsyncRollouts, orchestrator/rollout/async_source.py), SYNC
(nothing pending, no state). Each pipeline writes its mode into its state (key "mode"); checkpoints written before that are recognised by
their keys ("requests": STREAM, "batches": ONE_STEP_OFF).

What decides is the checkpoint's prompt-loader position:
- the same mode: the state as written (exact resume).
- ONE_STEP_OFF resumed by STREAM or SYNC: the state is dropped, with a note. The checkpoint's loader is
  before the pending batches' prompts (`AsyncRollouts.loader_state`), so those prompts are drawn again and
  regenerated with the checkpoint's weights: none lost or trained twice. placement.auto's async -> stream switch
  (orchestrator/placement/replace.py) takes this path.
- STREAM resumed by ONE_STEP_OFF or SYNC: refused (ResumeModeError) when the state holds untrained groups:
  the checkpoint's loader is past them (they were drawn), the one-step-off pipeline cannot read streamed groups and
  a synchronous run would skip their prompts. A state with none is dropped (nothing is pending).
- no state (a synchronous checkpoint, or a one-step-off one written while its batch generated): any mode.

A streamed state resumed by a streaming config is also checked against the settings it records (key
"multi_turn": env.name was set; "env": env.name; "max_staleness": algo.max_staleness; `stream_settings`). Checkpoints written before
they were recorded lack the keys: unknown, accepted as written.
- single-turn <-> multi-turn (env.name set or not): refused (ResumeModeError) when the state holds untrained groups.
  A single-turn state's requests are prompts with their finished and in-flight samples; a multi-turn state holds
  requests only (episodes are regenerated). The other pipeline would run them as the wrong kind: a multi-turn run
  would play single-turn prompts as environment episodes (dropping their samples), a single-turn run would generate
  the episodes' tasks as plain prompts. A state with no untrained group resumes (only counters are restored).
- one environment -> another (env.name changed, both multi-turn; key "env"): refused (ResumeModeError) when the
  state holds untrained groups: their requests are the first environment's tasks, which the other would play as
  its own episodes. A state with none resumes.
- algo.max_staleness k raised: accepted with a note. The capacity rule ((policy_version + k + 1) * prompts_per_step
  groups started) only allows more, and the drop rule drops fewer: nothing restored breaks a larger bound.
- k lowered: accepted with a note. The restored groups count as started, so while they exceed the new capacity
  `GroupBuffer.capacity` is 0 and no batch starts until the trainer catches up (no error, no deadlock: every
  take frees slots); the drop rule applies the new k to every group taken, so a restored group whose oldest token
  is more than k versions old is dropped (counted in async/dropped_groups, its prompts not trained) and no sample
  staler than the new k is ever trained. That is the same loss a run with that k has, so it is not refused.
Pure: no Ray, no torch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchestrator.rollout.modes import ONE_STEP_OFF, STREAM, SYNC, mode_kind

LEGACY_KEYS = (("requests", STREAM), ("batches", ONE_STEP_OFF))  # checkpoints without "mode"
SETTINGS = {mode: f"rollout.mode={mode}" for mode in (STREAM, ONE_STEP_OFF, SYNC)}
NAMES = {STREAM: "streaming (fully asynchronous)", ONE_STEP_OFF: "one-step-off (asynchronous)", SYNC: "synchronous"}


class ResumeModeError(ValueError):
    """A checkpoint's pending rollouts cannot be resumed in the configured rollout mode."""


def config_mode(cfg) -> str:
    """The rollout mode of loaded run config `cfg` as resume reads it: STREAM, ONE_STEP_OFF or SYNC (a mode of one's
    own: the built-in mode whose contract it keeps, orchestrator/rollout/modes.py)."""
    return mode_kind(cfg)


def written_mode(state: Optional[dict], where: str = "the checkpoint") -> str:
    """The mode that wrote `state` (a checkpoint's "async" state): its "mode", else recognised by its keys;
    SYNC for None or {}. Raises ResumeModeError naming `where` for an unknown mode or unrecognised keys."""
    if not state:
        return SYNC
    mode = state.get("mode")
    if mode is None:
        mode = next((m for key, m in LEGACY_KEYS if key in state), None)
    if mode not in (STREAM, ONE_STEP_OFF):
        raise ResumeModeError(f"{where}: its pending rollouts (state.json \"async\", keys {sorted(state)}) were "
                              f"written by an unknown rollout mode {mode!r}; known: {STREAM!r}, {ONE_STEP_OFF!r}")
    return mode


def describe_mode(cfg_or_mode) -> str:
    """"streaming (fully asynchronous): rollout.mode=stream" and the like, for a mode name or a run config."""
    mode = cfg_or_mode if isinstance(cfg_or_mode, str) else config_mode(cfg_or_mode)
    return f"{NAMES[mode]}: {SETTINGS[mode]}"


def state_to_load(state: Optional[dict], cfg, where: str = "the checkpoint") -> tuple[Optional[dict], str]:
    """(the state the rollouts of `cfg` load, or None; a note to print, or "") for a checkpoint's "async" state
    `state`, by the rules of the module docstring. Raises ResumeModeError (naming `where`, the mode that wrote it,
    this config's rollout.mode, and how to resume it) for a streamed state with
    untrained groups resumed by a non-streaming config, and for a state `written_mode` does not recognise; a streamed
    state resumed by a streaming config goes through `check_stream_settings` (its note, or its ResumeModeError)."""
    written, resumed = written_mode(state, where), config_mode(cfg)
    if written == resumed == STREAM:
        return state, check_stream_settings(state, cfg, where)
    if written == resumed or written == SYNC:
        return state, ""
    if written == ONE_STEP_OFF:
        return None, (f"resume: {where} was written by a {NAMES[ONE_STEP_OFF]} run; this {NAMES[resumed]} run draws "
                      "its pending batch's prompts again (the checkpoint's loader is before them) and generates "
                      "them with the checkpoint's weights")
    groups = len(state.get("requests", []))
    if not groups:
        return None, ""
    why = ("the one-step-off pipeline cannot read streamed groups" if resumed == ONE_STEP_OFF
           else "a synchronous run would skip their prompts")
    raise ResumeModeError(
        f"{where} was written by a {describe_mode(STREAM)} run and holds {groups} untrained groups that run drew "
        f"from the prompt loader (its saved position is past them); this config ({describe_mode(cfg)}) cannot "
        f"resume them: {why}. Resume it with {SETTINGS[STREAM]} (algo.max_staleness >= 1), or start a new run "
        "(checkpoint.resume=none)")


def stream_settings(cfg) -> dict:
    """{"multi_turn": env.name is set, "env": env.name (None single-turn), "max_staleness": algo.max_staleness} of
    run config `cfg`: what a streamed state records (StreamRollouts.state_dict) for `check_stream_settings`."""
    return {"multi_turn": bool(cfg.env.name), "env": cfg.env.name or None, "max_staleness": int(cfg.algo.max_staleness)}


def _turns(multi_turn: bool) -> str:
    return "multi-turn (env.name set)" if multi_turn else "single-turn (env.name unset)"


def check_stream_settings(state: dict, cfg, where: str = "the checkpoint") -> str:
    """A note to print ("" when none) for resuming streamed `state` with streaming config `cfg`, by the rules of the
    module docstring: a changed algo.max_staleness is noted. Raises ResumeModeError (naming `where`, the setting,
    the checkpoint's and the config's values, and how to resume) for single-turn <-> multi-turn, or another
    env.name, with untrained groups. A key the state lacks (older checkpoints) is not checked."""
    now, groups = stream_settings(cfg), len(state.get("requests", []))
    was_multi = state.get("multi_turn")
    if was_multi is not None and bool(was_multi) != now["multi_turn"] and groups:
        why = ("a multi-turn run would play its prompts as environment episodes and drop their generated samples"
               if now["multi_turn"] else "a single-turn run would generate its episodes' tasks as plain prompts")
        raise ResumeModeError(
            f"{where} was written by a {_turns(bool(was_multi))} streaming run and holds {groups} untrained groups "
            f"of that kind; this config is {_turns(now['multi_turn'])} (env.name={cfg.env.name!r}): {why}. Resume it "
            f"with the checkpoint's env.name ({'the same environment' if was_multi else 'unset'}), or start a new "
            "run (checkpoint.resume=none)")
    env_was = state.get("env")
    if env_was and now["env"] and env_was != now["env"] and groups:
        raise ResumeModeError(
            f"{where} was written by a multi-turn streaming run of env.name={env_was!r} and holds {groups} untrained "
            f"groups of its tasks; this config runs env.name={now['env']!r}, which would play them as its own "
            f"episodes. Resume it with env.name={env_was}, or start a new run (checkpoint.resume=none)")
    k_was, k = state.get("max_staleness"), now["max_staleness"]
    if k_was is None or int(k_was) == k:
        return ""
    if k > int(k_was):
        return (f"resume: {where} was written with algo.max_staleness={k_was}; this run's {k} lets more batches start "
                "ahead of the trainer and drops fewer groups (its untrained groups resume as written)")
    return (f"resume: {where} was written with algo.max_staleness={k_was}; with this run's {k}, no new batch starts "
            f"until its {groups} untrained groups fit the smaller capacity, and any of them more than {k} versions "
            "stale when taken is dropped (async/dropped_groups), never trained")


def check_written_by(state: dict, mode: str, reader: str) -> None:
    """Raises ResumeModeError unless `state` (a checkpoint's "async" state) was written in `mode`, naming `reader`
    (the pipeline's load_state_dict) and the mode that wrote it."""
    written = written_mode(state)
    if written != mode:
        raise ResumeModeError(f"{reader}: the checkpoint's pending rollouts were written by a "
                              f"{describe_mode(written)} run; this pipeline reads {describe_mode(mode)} state only "
                              "(GRPOController.restore chooses what to load: resume_mode.state_to_load)")


def read_async_state(folder: Path) -> Optional[dict]:
    """The "async" state of checkpoint `folder`'s state.json (None when it has none). Raises OSError /
    json.JSONDecodeError for a missing or unreadable state.json."""
    return json.loads((Path(folder) / "state.json").read_text()).get("async")


def check_resumable(folder: Optional[Path], cfg) -> None:
    """`state_to_load` on checkpoint `folder`'s "async" state for `cfg` (nothing for None: a fresh start), before
    any actor starts or stops: raises ResumeModeError when `cfg` cannot resume it (see the module docstring)."""
    if folder is not None:
        state_to_load(read_async_state(folder), cfg, f"checkpoint {folder}")
