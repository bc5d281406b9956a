"""A checkpoint's pending rollouts resumed in another rollout mode (orchestrator/rollout/resume_mode.py): a streamed
checkpoint with untrained groups is refused by one-step-off and synchronous configs (naming the settings and how to
resume it), a one-step-off checkpoint's pending batch is dropped (its loader is before the batch's prompts), the
same mode resumes the state as written; the mode is read from the state's "mode" or, in older checkpoints, its keys.
A streamed checkpoint resumed by a streaming config: single-turn <-> multi-turn with untrained groups is refused, a
changed algo.max_staleness resumes with a note (a smaller one: the drop rule keeps every trained sample within it).
Real pipeline states come from the fakes of tests/unit/test_async_rollouts.py and tests/unit/test_stream_resume.py.

    .venv/bin/python -m pytest tests/unit/test_resume_mode.py -q
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.data import StatefulLoader
from orchestrator.rollout.resume_mode import (ONE_STEP_OFF, STREAM, SYNC, ResumeModeError, check_resumable,
                                              config_mode, state_to_load, written_mode)
from orchestrator.rollout.stream_state import STATE_KEYS
from tests.unit.test_async_rollouts import FakeController, _rollouts, _run_to
from tests.unit.test_stream_resume import _checkpoint, _setup, _steps


def _cfg(mode: str, placement: str = "disaggregated", env: str | None = None, k: int = 2):
    """A loaded run config's parts resume_mode reads (k = 2 and single-turn: the streamed fakes' settings)."""
    return SimpleNamespace(placement=SimpleNamespace(mode=placement), rollout=SimpleNamespace(mode=mode),
                           env=SimpleNamespace(name=env), algo=SimpleNamespace(max_staleness=k))


STREAMING, ONE_OFF = _cfg(STREAM), _cfg(ONE_STEP_OFF)
COLOCATED, DISAGGREGATED = _cfg(SYNC, "colocated"), _cfg(SYNC)


def _stream_state() -> dict:
    """A streaming run's checkpoint state after 3 steps (JSON round trip): untrained groups in it."""
    rollouts, fakes, engine = _setup()
    _steps(rollouts, engine, [1, 2, 3])
    return _checkpoint(rollouts, fakes)


def _one_step_off_state() -> tuple[dict, FakeController]:
    """A one-step-off run's checkpoint state after step 2 of 4 (batch 3 generated, pending)."""
    ctl = FakeController(total=4)
    rollouts = _rollouts(ctl)
    _run_to(ctl, rollouts, (1, 2))
    return json.loads(json.dumps(rollouts.state_dict())), rollouts


def test_each_pipeline_writes_its_mode_and_older_checkpoints_are_recognised_by_their_keys():
    stream, (one_off, _) = _stream_state(), _one_step_off_state()
    assert stream["mode"] == STREAM and one_off["mode"] == ONE_STEP_OFF
    assert written_mode(stream) == STREAM and written_mode(one_off) == ONE_STEP_OFF
    legacy_stream = {k: v for k, v in stream.items() if k != "mode"}
    legacy_one_off = {k: v for k, v in one_off.items() if k != "mode"}
    assert written_mode(legacy_stream) == STREAM and written_mode(legacy_one_off) == ONE_STEP_OFF
    assert written_mode(None) == written_mode({}) == SYNC
    with pytest.raises(ResumeModeError, match=r"checkpoint c1: .*keys \['loader'\].* unknown rollout mode None"):
        written_mode({"loader": {}}, "checkpoint c1")
    with pytest.raises(ResumeModeError, match="unknown rollout mode 'turbo'"):
        written_mode({"mode": "turbo", "requests": []})


def test_config_mode():
    assert [config_mode(c) for c in (STREAMING, ONE_OFF, COLOCATED, DISAGGREGATED)] == [
        STREAM, ONE_STEP_OFF, SYNC, SYNC]


def test_the_same_mode_resumes_the_state_as_written():
    stream, (one_off, _) = _stream_state(), _one_step_off_state()
    assert state_to_load(stream, STREAMING) == (stream, "")
    assert state_to_load(one_off, ONE_OFF) == (one_off, "")
    legacy = {k: v for k, v in stream.items() if k != "mode"}  # written before the mode was stored
    assert state_to_load(legacy, STREAMING) == (legacy, "")


def test_a_streamed_checkpoint_with_untrained_groups_is_refused_by_a_one_step_off_config():
    stream = _stream_state()
    groups = len(stream["requests"])
    assert groups > 0
    for state in (stream, {k: v for k, v in stream.items() if k != "mode"}):  # new and older checkpoints
        with pytest.raises(ResumeModeError) as e:
            state_to_load(state, ONE_OFF, "checkpoint ck/step_000003")
        msg = str(e.value)
        assert msg.startswith("checkpoint ck/step_000003 was written by a streaming (fully asynchronous): "
                              "rollout.mode=stream run")
        assert f"holds {groups} untrained groups" in msg
        assert "this config (one-step-off (asynchronous): rollout.mode=one_step_off) cannot resume them: the " \
               "one-step-off pipeline cannot read" in msg
        assert "Resume it with rollout.mode=stream" in msg


def test_a_streamed_checkpoint_with_untrained_groups_is_refused_by_a_synchronous_config():
    stream = _stream_state()
    for cfg in (COLOCATED, DISAGGREGATED):
        with pytest.raises(ResumeModeError, match="this config \\(synchronous: rollout.mode=sync\\) "
                                                  "cannot resume them: a synchronous run would skip their prompts"):
            state_to_load(stream, cfg)


def test_a_streamed_checkpoint_with_no_untrained_group_is_dropped_by_other_modes():
    empty = {"mode": STREAM, "requests": [], "dropped_groups": 0, "dropped_samples": 0, "batches_drawn": 4}
    for cfg in (ONE_OFF, COLOCATED):
        assert state_to_load(empty, cfg) == (None, "")


def test_a_one_step_off_checkpoint_is_dropped_by_stream_and_synchronous_configs_with_a_note():
    state, rollouts = _one_step_off_state()
    for cfg, name in ((STREAMING, "streaming (fully asynchronous)"), (COLOCATED, "synchronous")):
        pending, note = state_to_load(state, cfg, "checkpoint ck/step_000002")
        assert pending is None
        assert note == ("resume: checkpoint ck/step_000002 was written by a one-step-off (asynchronous) run; this "
                        f"{name} run draws its pending batch's prompts again (the checkpoint's loader is before them) "
                        "and generates them with the checkpoint's weights")
    # what makes the drop lossless: the checkpoint's loader (`loader_state`) is before batch 3's prompts
    loader = StatefulLoader(list(range(20)), 2, seed=0, shuffle=True)
    loader.load_state_dict(rollouts.loader_state())
    batch3 = rollouts.batches[3].launched.requests  # FakeController: prompt ids [k + 3] for loader item k
    assert [r.prompt_ids[0] - 3 for r in batch3] == list(loader.next_batch())


def test_a_synchronous_checkpoint_resumes_in_any_mode():
    for cfg in (STREAMING, ONE_OFF, COLOCATED):
        assert state_to_load(None, cfg) == (None, "")


def test_the_pipelines_refuse_another_modes_state_instead_of_a_key_error():
    stream, (one_off, _) = _stream_state(), _one_step_off_state()
    with pytest.raises(ResumeModeError, match="AsyncRollouts.load_state_dict: .* written by a streaming"):
        _rollouts(FakeController(total=4, start_step=3)).load_state_dict(stream)
    with pytest.raises(ResumeModeError, match="StreamRollouts.load_state_dict: .* written by a one-step-off"):
        _setup(start_step=2)[0].load_state_dict(one_off)


def test_check_resumable_reads_the_checkpoints_state_before_any_actor_starts(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"step": 3, "loader": {}, "async": _stream_state()}))
    with pytest.raises(ResumeModeError, match=f"checkpoint {tmp_path} was written by a streaming"):
        check_resumable(tmp_path, ONE_OFF)
    check_resumable(tmp_path, STREAMING)
    check_resumable(None, ONE_OFF)  # a fresh start: nothing to check
    (tmp_path / "state.json").write_text(json.dumps({"step": 3, "loader": {}}))  # a synchronous run's
    check_resumable(tmp_path, ONE_OFF)


def test_the_controllers_restore_loads_what_the_config_resumes(capsys):
    from orchestrator.controller import GRPOController

    one_off, _ = _one_step_off_state()
    state = {"step": 2, "weight_version": 2, "loader": {"position": 4, "epoch": 0}, "async": one_off}
    ctl = GRPOController.__new__(GRPOController)  # the parts restore uses, no actors
    loaded, synced = [], []
    ctl.job = SimpleNamespace(restore=lambda folder: json.loads(json.dumps(state)))
    ctl.loader = SimpleNamespace(load_state_dict=loaded.append)
    ctl.sync_weights = lambda step, row: synced.append(step)
    ctl.guards = SimpleNamespace(load_state_dict=lambda state: None)  # (a checkpoint without guard state)
    ctl.cfg = STREAMING  # placement.auto's async -> stream switch: the pending batch is dropped
    ctl.restore("ck/step_000002")
    assert ctl.async_state is None and ctl.start_step == 2 and loaded == [state["loader"]] and synced == [2]
    assert "was written by a one-step-off (asynchronous) run" in capsys.readouterr().out
    ctl.cfg = ONE_OFF
    ctl.restore("ck/step_000002")
    assert ctl.async_state == one_off
    state["async"] = _stream_state()
    with pytest.raises(ResumeModeError, match="checkpoint ck/step_000002 was written by a streaming"):
        ctl.restore("ck/step_000002")


# ---- a streamed checkpoint resumed by a streaming config with other settings -------------------------------
def _multi_turn_state() -> dict:
    """What a multi-turn streaming run writes: the untrained groups' requests only (episodes are regenerated)."""
    state = {k: v for k, v in _stream_state().items() if k not in STATE_KEYS}
    return {**state, "multi_turn": True, "env": "countdown"}


def test_a_streamed_state_records_its_settings_and_older_ones_without_them_resume_as_written():
    stream = _stream_state()
    assert (stream["multi_turn"], stream["env"], stream["max_staleness"]) == (False, None, 2)
    legacy = {k: v for k, v in stream.items() if k not in ("multi_turn", "env", "max_staleness")}
    for cfg in (STREAMING, _cfg(STREAM, env="countdown", k=1)):  # unknown: not checked
        assert state_to_load(legacy, cfg) == (legacy, "")


def test_single_turn_and_multi_turn_do_not_resume_each_others_untrained_groups():
    single, multi = _stream_state(), _multi_turn_state()
    to_multi = _cfg(STREAM, env="countdown")
    with pytest.raises(ResumeModeError) as e:
        state_to_load(single, to_multi, "checkpoint ck/step_000003")
    msg = str(e.value)
    assert msg.startswith(f"checkpoint ck/step_000003 was written by a single-turn (env.name unset) streaming run and "
                          f"holds {len(single['requests'])} untrained groups")
    assert "this config is multi-turn (env.name set) (env.name='countdown')" in msg
    assert "Resume it with the checkpoint's env.name (unset), or start a new run (checkpoint.resume=none)" in msg
    with pytest.raises(ResumeModeError, match=r"written by a multi-turn \(env.name set\) streaming run .* this config "
                                              r"is single-turn \(env.name unset\) \(env.name=None\): a single-turn run "
                                              r"would generate its episodes' tasks as plain prompts. Resume it with the "
                                              r"checkpoint's env.name \(the same environment\)"):
        state_to_load(multi, STREAMING)
    assert state_to_load(multi, to_multi) == (multi, "")
    empty = {**multi, "requests": []}  # nothing untrained: only counters are restored
    assert state_to_load(empty, STREAMING) == (empty, "")


def test_another_environment_does_not_resume_the_untrained_episodes_of_the_first():
    multi = _multi_turn_state()  # env.name=countdown
    groups = len(multi["requests"])
    with pytest.raises(ResumeModeError) as e:
        state_to_load(multi, _cfg(STREAM, env="guessing_game"), "checkpoint ck/step_000003")
    assert str(e.value) == (
        f"checkpoint ck/step_000003 was written by a multi-turn streaming run of env.name='countdown' and holds "
        f"{groups} untrained groups of its tasks; this config runs env.name='guessing_game', which would play them "
        "as its own episodes. Resume it with env.name=countdown, or start a new run (checkpoint.resume=none)")
    empty = {**multi, "requests": []}  # nothing untrained: resumes
    assert state_to_load(empty, _cfg(STREAM, env="guessing_game")) == (empty, "")
    legacy = {k: v for k, v in multi.items() if k != "env"}  # written before "env" was recorded: not checked
    assert state_to_load(legacy, _cfg(STREAM, env="guessing_game")) == (legacy, "")


def test_a_changed_max_staleness_resumes_with_a_note():
    stream = _stream_state()
    groups = len(stream["requests"])
    state, note = state_to_load(stream, _cfg(STREAM, k=4), "checkpoint c3")
    assert state is stream
    assert note == ("resume: checkpoint c3 was written with algo.max_staleness=2; this run's 4 lets more batches start "
                    "ahead of the trainer and drops fewer groups (its untrained groups resume as written)")
    state, note = state_to_load(stream, _cfg(STREAM, k=1), "checkpoint c3")
    assert state is stream
    assert note == ("resume: checkpoint c3 was written with algo.max_staleness=2; with this run's 1, no new batch "
                    f"starts until its {groups} untrained groups fit the smaller capacity, and any of them more than 1 "
                    "versions stale when taken is dropped (async/dropped_groups), never trained")


def test_a_smaller_max_staleness_resume_trains_nothing_staler_than_the_new_bound():
    """The reason a smaller k is accepted: the drop rule applies it to the restored groups."""
    state = _stream_state()  # k = 2, after step 3
    resumed, _, engine = _setup(start_step=3, max_staleness=1)
    resumed.load_state_dict(state)
    engine.version = 3
    staleness, dropped = [], 0
    for step in (4, 5, 6, 7):  # as _steps, keeping each batch's staleness (the trained policy is version step - 1)
        resumed.launch(step)
        row: dict = {}
        staleness += [step - 1 - min(t.token_versions) for t in resumed.take(step, step - 1, row)]
        dropped = row.get("async/dropped_groups", dropped)
        engine.version = step
        resumed.synced(step)
    assert staleness and max(staleness) <= 1, staleness
    assert dropped > 0  # the restored groups 2 versions stale (trained by a k=2 resume) were dropped
    assert resumed.buffer.k == 1 and resumed.state_dict()["max_staleness"] == 1
