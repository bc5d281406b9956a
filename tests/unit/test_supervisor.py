"""The supervisor's pure parts (restart budget, messages, what it restarts from) and its loop over a fake
controller: a dead supervised actor restarts from the last checkpoint, counted in `run/restarts`."""
from __future__ import annotations

import json
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray

import orchestrator.runtime.supervisor as sup
from orchestrator.runtime.stopping import StepAbandoned
from orchestrator.runtime.faults import RestartBudget
from orchestrator.runtime.supervisor import (Failure, RunFailedError, checkpoint_step, give_up_message,
                                             restart_message, supervise, supervised)

TRAINER_DEAD = Failure("trainer", "trainer rank 1", "dead")
ROLLOUT_DEAD = Failure("rollout", "rollout worker 0", "dead")


def _checkpoint(root: Path, step: int) -> str:
    """A complete checkpoint folder with its manifest (small stand-in files)."""
    from orchestrator.checkpoint import step_folder, write_manifest

    folder = step_folder(root, step)
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "trainer_state.pt").write_bytes(b"state" * 100)
    (folder / "state.json").write_text(json.dumps({"step": step}))
    write_manifest(folder, step=step, base_model="/models/tiny")
    return str(folder)


def test_the_budget_is_the_jobs_shared_with_rollout_restarts(monkeypatch, tmp_path):
    monkeypatch.setattr(sup, "probe", lambda actors: [TRAINER_DEAD])
    ctl = FakeController(max_restarts=2, fail=5, ckpt=_checkpoint(tmp_path, 2))
    ctl.job.restarts.spend("rollout worker 0", "killed")  # one restart already spent on a lost rollout worker
    with pytest.raises(RunFailedError):
        supervise(ctl, ctl.run_steps)
    assert ctl.restarts == [Path(tmp_path / "step_000002")] and ctl.job.restarts.used == 2


def test_only_trainer_reference_reward_are_restarted_from_the_checkpoint():
    hung_ref = Failure("reference", "reference actor", "hung")
    assert supervised([ROLLOUT_DEAD, TRAINER_DEAD, hung_ref]) == [TRAINER_DEAD, hung_ref]
    assert supervised([ROLLOUT_DEAD]) == []


def test_messages_name_the_actor_error_count_and_what_to_do(tmp_path):
    err = TimeoutError("an actor call did not return within run.phase_timeout_s=5s\nmore")
    line = restart_message([TRAINER_DEAD], err, 1, 3, tmp_path / "step_000004", 4)
    assert "trainer rank 1 dead (TimeoutError: an actor call did not return within run.phase_timeout_s=5s)" in line
    assert "restart 1/3 from checkpoint" in line and "step_000004 (step 4)" in line and "more" not in line
    assert "the base model (step 0" in restart_message([TRAINER_DEAD], err, 1, 3, None, 0)
    msg = give_up_message([TRAINER_DEAD], err, 3, tmp_path / "step_000004")
    assert "trainer rank 1 dead" in msg and "run.max_restarts=3" in msg and "checkpoint.resume=latest" in msg
    assert "set checkpoint.every_steps" in give_up_message([TRAINER_DEAD], err, 0, None)


def test_checkpoint_step_reads_state_json(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"step": 7}))
    assert checkpoint_step(tmp_path) == 7
    assert checkpoint_step(None) == 0 and checkpoint_step(tmp_path / "missing") == 0


class FakeController:
    """run_steps fails `fail` times (as a dead actor would), then finishes; restart() records the folder."""

    def __init__(self, max_restarts: int, fail: int, ckpt):
        self.cfg = SimpleNamespace(run=SimpleNamespace(max_restarts=max_restarts))
        self.job = SimpleNamespace(restarts=RestartBudget(max_restarts))
        self.actors, self.last_checkpoint = object(), ckpt
        self.stop = SimpleNamespace(requested=None)
        self.fail, self.extras, self.restarts = fail, [], []

    def run_steps(self, extra: dict) -> None:
        self.extras.append(extra)
        if len(self.extras) <= self.fail:
            raise ray.exceptions.RayActorError()

    def restart(self, folder) -> None:
        self.restarts.append(folder)


def test_supervise_restarts_from_the_last_checkpoint_and_counts(monkeypatch, tmp_path):
    monkeypatch.setattr(sup, "probe", lambda actors: [TRAINER_DEAD])
    ctl = FakeController(max_restarts=3, fail=2, ckpt=_checkpoint(tmp_path, 2))
    assert supervise(ctl, ctl.run_steps) == 2
    assert ctl.extras == [{"run/restarts": 0}, {"run/restarts": 1}, {"run/restarts": 2}]
    assert ctl.restarts == [Path(tmp_path / "step_000002")] * 2


def test_supervise_goes_back_past_a_torn_last_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setattr(sup, "probe", lambda actors: [TRAINER_DEAD])
    _checkpoint(tmp_path, 2)
    ctl = FakeController(max_restarts=3, fail=1, ckpt=_checkpoint(tmp_path, 4))
    (tmp_path / "step_000004" / "trainer_state.pt").write_bytes(b"torn")
    with pytest.warns(UserWarning, match=r"skipping checkpoint .*step_000004: .*trainer_state.pt"):
        supervise(ctl, ctl.run_steps)
    assert ctl.restarts == [Path(tmp_path / "step_000002")]


def test_supervise_before_any_checkpoint_restarts_from_the_base_model(monkeypatch):
    monkeypatch.setattr(sup, "probe", lambda actors: [TRAINER_DEAD])
    ctl = FakeController(max_restarts=1, fail=1, ckpt=None)
    supervise(ctl, ctl.run_steps)
    assert ctl.restarts == [None]


def test_supervise_gives_up_after_max_restarts(monkeypatch):
    monkeypatch.setattr(sup, "probe", lambda actors: [TRAINER_DEAD])
    ctl = FakeController(max_restarts=1, fail=5, ckpt=None)
    with pytest.raises(RunFailedError, match=r"trainer rank 1 dead .* after 1 restart\(s\) of run.max_restarts=1"):
        supervise(ctl, ctl.run_steps)
    assert len(ctl.restarts) == 1


def test_supervise_lets_other_errors_through(monkeypatch):
    monkeypatch.setattr(sup, "probe", lambda actors: [ROLLOUT_DEAD])  # rollout workers: their own restarts
    ctl = FakeController(max_restarts=3, fail=1, ckpt=None)
    with pytest.raises(ray.exceptions.RayActorError):
        supervise(ctl, ctl.run_steps)

    def bug(extra):
        raise ValueError("a bug, not a dead actor")

    with pytest.raises(ValueError, match="a bug"):
        supervise(ctl, bug)
    assert ctl.restarts == []


def test_no_restart_while_stopping_on_a_signal(monkeypatch):
    # scancel signals every process of the job: Ray goes down with the controller's step, nothing to restart
    monkeypatch.setattr(sup, "probe", lambda actors: [TRAINER_DEAD])
    ctl = FakeController(max_restarts=3, fail=1, ckpt=None)
    ctl.stop.requested = signal.SIGTERM
    with pytest.raises(StepAbandoned, match="RayActorError while stopping") as info:
        supervise(ctl, ctl.run_steps)
    assert info.value.exit_code == 143 and ctl.restarts == []
