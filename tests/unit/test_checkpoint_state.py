"""Checkpoints are read with safe loaders only (orchestrator/checkpoint/state.py): the Trainer's checkpoint
loads with torch.load(weights_only=True), carries its manifest and resumes the LR schedule exactly (case C09
through a real save and load); RNG states round-trip; an old checkpoint whose scheduler state holds an
`inspect.Signature` is refused naming the file, and `orchestrator.checkpoint.upgrade` converts it."""
from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from orchestrator.checkpoint import CheckpointError, read_manifest, verify_manifest
from orchestrator.checkpoint.state import load_trainer_state, rng_state, set_rng_state
from orchestrator.checkpoint.upgrade import main as upgrade_main
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import save_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


def _trainer(tiny, **over) -> Trainer:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-6, "warmup_steps": 10, "total_steps": 100, "min_lr_ratio": 0.0, "micro_batch_size": 2, "num_threads": 1,
               "precision": "fp32", **over})
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


def _advance(t: Trainer, steps: int) -> None:
    """Move the schedule on `steps` optimizer steps (no gradients: the weights stay)."""
    for _ in range(steps):
        t.optimizer.step()
        t.scheduler.step()
        t.step += 1


def test_c09_through_a_safe_checkpoint(tiny, tmp_path):
    a = _trainer(tiny)
    _advance(a, 50)
    a.save_checkpoint(str(tmp_path / "ck"), {"step": 50})
    raw = torch.load(tmp_path / "ck" / "trainer_state.pt", weights_only=True)  # plain data only
    assert raw["scheduler"]["lr_lambdas"] == [{}] and raw["scheduler"]["last_epoch"] == 50
    assert set(raw["rng"]) == {"torch", "numpy", "python"} | ({"cuda"} if torch.cuda.is_available() else set())
    assert read_manifest(tmp_path / "ck")["step"] == 50 and verify_manifest(tmp_path / "ck") == []
    assert (tmp_path / "ck" / "policy" / "tokenizer_config.json").exists() or not (tiny / "tokenizer_config.json").exists()
    b = _trainer(tiny)
    assert b.load_checkpoint(str(tmp_path / "ck")) == {"step": 50}
    assert b.scheduler.get_last_lr()[0] == pytest.approx(5.868241e-7, abs=1e-13)  # not the warmup restarted
    _advance(b, 1)
    assert b.scheduler.get_last_lr()[0] == pytest.approx(5.695866e-7, abs=1e-13)


def test_rng_states_round_trip_through_the_safe_loader(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save({"rng": rng_state()}, tmp_path / "s.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    set_rng_state(load_trainer_state(tmp_path / "s.pt")["rng"])
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]
    set_rng_state(torch.get_rng_state())  # a checkpoint before numpy / Python states: torch's only


def _old_style_checkpoint(tiny, folder) -> Trainer:
    """A checkpoint as rl-orchestrator wrote it before: the scheduler's LR lambda a bound method whose
    function carries an inspect.Signature (Ray sets `__signature__` on actor methods), no manifest."""
    t = _trainer(tiny)
    _advance(t, 50)

    class Old:
        def lam(self, step: int) -> float:
            return t.scheduler.lr_lambdas[0](step)
    Old.lam.__signature__ = inspect.signature(Old.lam)
    sched = t.scheduler.state_dict()
    sched["lr_lambdas"] = [dict(Old().lam.__dict__)]
    t.save_checkpoint(str(folder), {"step": 50})
    torch.save({"optimizer": t.optimizer.state_dict(), "scheduler": sched, "step": t.step,
                "rng": torch.get_rng_state()}, folder / "trainer_state.pt")
    (folder / "manifest.json").unlink()
    return t


def test_an_unsafe_old_checkpoint_is_refused_then_upgraded(tiny, tmp_path, capsys):
    folder = tmp_path / "step_000050"
    _old_style_checkpoint(tiny, folder)
    with pytest.raises(CheckpointError) as e:
        _trainer(tiny).load_checkpoint(str(folder))
    msg = str(e.value)
    assert msg.startswith(f"{folder / 'trainer_state.pt'}: refused by the safe loader (torch.load weights_only=True)")
    assert "it holds a inspect.Signature object" in msg and "python -m orchestrator.checkpoint.upgrade" in msg
    assert upgrade_main([str(folder)]) == 0
    assert "scheduler state made plain" in capsys.readouterr().out
    assert verify_manifest(folder) == [] and read_manifest(folder)["step"] == 50
    b = _trainer(tiny)
    assert b.load_checkpoint(str(folder)) == {"step": 50}
    assert b.scheduler.get_last_lr()[0] == pytest.approx(5.868241e-7, abs=1e-13)
    assert upgrade_main([str(folder)]) == 0 and "already current" in capsys.readouterr().out


def test_a_missing_or_garbled_state_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'nope.pt'}: unreadable"):
        load_trainer_state(tmp_path / "nope.pt")
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'bad.pt'}: unreadable"):
        load_trainer_state(tmp_path / "bad.pt")


def test_resume_refuses_an_unsafe_old_checkpoint_before_any_actor_starts(tiny, tmp_path):
    from types import SimpleNamespace

    from orchestrator.checkpoint import CheckpointWarning
    from orchestrator.checkpoint.resume import resume_checkpoint

    folder = tmp_path / "ckpt" / "step_000050"
    _old_style_checkpoint(tiny, folder)
    named = SimpleNamespace(resume=str(folder), dir=str(tmp_path / "ckpt"))
    with pytest.warns(CheckpointWarning, match="no manifest.json"), pytest.raises(CheckpointError, match="safe loader"):
        resume_checkpoint(named, tiny, "tiny")  # the controller's constructor calls this, before Ray
    with pytest.warns(CheckpointWarning, match="skipping"):  # auto never picks a checkpoint without a manifest
        assert resume_checkpoint(SimpleNamespace(resume="auto", dir=str(tmp_path / "ckpt")), tiny, "tiny") is None
    assert upgrade_main([str(folder)]) == 0
    assert resume_checkpoint(SimpleNamespace(resume="auto", dir=str(tmp_path / "ckpt")), tiny, "tiny") == folder
