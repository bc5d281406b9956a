"""A checkpoint's pending rollouts resumed in another rollout mode (orchestrator/rollout/resume_mode.py): a streamed
checkpoint with untrained groups is refused by one-step-off and synchronous configs (naming the settings and how to
resume it), a one-step-off checkpoint's pending batch is dropped (its loader is before the batch's prompts), the
same mode resumes the state as written; the mode is read from the state's "mode" or, in older checkpoints, its keys.
Real pipeline states come from the fakes of tests/unit/test_async_rollouts.py and tests/unit/test_stream_resume.py.

    .venv/bin/python -m pytest tests/unit/test_resume_mode.py -q
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.data import StatefulLoader
from orchestrator.rollout.resume_mode import (ONE_STEP_OFF, STREAM, SYNCHRONOUS, ResumeModeError, check_resumable,
                                              config_mode, state_to_load, written_mode)
from tests.unit.test_async_rollouts import FakeController, _rollouts, _run_to
from tests.unit.test_stream_resume import _checkpoint, _setup, _steps


def _cfg(mode: str, partial: bool = False):
    return SimpleNamespace(placement=SimpleNamespace(mode=mode), rollout=SimpleNamespace(partial_rollout=partial))


STREAMING, ONE_OFF = _cfg("disaggregated_async", True), _cfg("disaggregated_async")
COLOCATED, DISAGGREGATED = _cfg("colocated"), _cfg("disaggregated")


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
    assert written_mode(None) == written_mode({}) == SYNCHRONOUS
    with pytest.raises(ResumeModeError, match=r"checkpoint c1: .*keys \['loader'\].* unknown rollout mode None"):
        written_mode({"loader": {}}, "checkpoint c1")
    with pytest.raises(ResumeModeError, match="unknown rollout mode 'turbo'"):
        written_mode({"mode": "turbo", "requests": []})


def test_config_mode():
    assert [config_mode(c) for c in (STREAMING, ONE_OFF, COLOCATED, DISAGGREGATED)] == [
        STREAM, ONE_STEP_OFF, SYNCHRONOUS, SYNCHRONOUS]


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
                              "placement.mode=disaggregated_async rollout.partial_rollout=true run")
        assert f"holds {groups} untrained groups" in msg
        assert "this config (one-step-off (asynchronous): placement.mode=disaggregated_async " \
               "rollout.partial_rollout=false) cannot resume them: the one-step-off pipeline cannot read" in msg
        assert "Resume it with placement.mode=disaggregated_async rollout.partial_rollout=true" in msg


def test_a_streamed_checkpoint_with_untrained_groups_is_refused_by_a_synchronous_config():
    stream = _stream_state()
    for cfg in (COLOCATED, DISAGGREGATED):
        with pytest.raises(ResumeModeError, match=f"this config \\(synchronous: placement.mode={cfg.placement.mode}\\) "
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
