"""A checkpoint of another model is refused before any actor starts (orchestrator/checkpoint/compat.py and
the controller's constructor / `rl-orch run`), naming both models and the first field that differs; the
time-based checkpoint decision (orchestrator/checkpoint/schedule.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import ray

from orchestrator.checkpoint import check_same_model, checkpoint_due, model_identity, read_manifest, write_manifest
from orchestrator.checkpoint.compat import first_difference

SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 128}
OTHER = {**SMALL, "hidden_size": 128, "num_hidden_layers": 4}


def _hf_folder(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32", "rope_theta": 1e4}))
    return folder


def _checkpoint(root: Path, config: dict, manifest: bool = True) -> Path:
    folder = root / "step_000003"
    _hf_folder(folder / "policy", config)
    (folder / "trainer_state.pt").write_bytes(b"x")
    (folder / "state.json").write_text('{"step": 3}')
    if manifest:
        write_manifest(folder, step=3, base_model="/models/small")
    return folder


def test_identity_keeps_the_fields_that_decide_the_weights(tmp_path: Path) -> None:
    ident = model_identity(_hf_folder(tmp_path / "m", SMALL) / "config.json")
    assert ident == SMALL  # torch_dtype and rope_theta are not identity
    assert first_difference(ident, dict(ident)) is None
    assert first_difference(ident, OTHER) == ("hidden_size", 64, 128)  # the first in IDENTITY_FIELDS order
    assert first_difference(ident, {**ident, "num_experts": 8}) == ("num_experts", None, 8)


@pytest.mark.parametrize("manifest", [True, False])  # from the manifest, or policy/config.json of an old one
def test_another_models_checkpoint_is_refused_naming_both(tmp_path: Path, manifest: bool) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt", SMALL, manifest)
    same, other = _hf_folder(tmp_path / "same", SMALL), _hf_folder(tmp_path / "other", OTHER)
    check_same_model(ckpt, read_manifest(ckpt), same, "models/same")  # no error
    with pytest.raises(ValueError) as e:
        check_same_model(ckpt, read_manifest(ckpt), other, "models/other")
    msg = str(e.value)
    assert f"checkpoint {ckpt} holds another model than model.path='models/other'" in msg
    assert "LlamaForCausalLM, hidden_size 64, 2 layers, vocab 97" in msg  # the checkpoint's
    assert f"model.path ({other}) is LlamaForCausalLM, hidden_size 128, 4 layers, vocab 97" in msg
    assert "first difference: hidden_size = 64 in the checkpoint, 128 in model.path" in msg
    assert ("(trained from /models/small)" in msg) == manifest


def _cli_args(tmp_path: Path, model: Path, resume: str) -> argparse.Namespace:
    return argparse.Namespace(config=None, force=False, overrides=[
        f"model.path={model}", f"run.output_dir={tmp_path / 'run'}", f"checkpoint.dir={tmp_path / 'run' / 'ckpt'}",
        f"checkpoint.resume={resume}"])


@pytest.mark.parametrize("resume", ["explicit", "auto"])
def test_rl_orch_run_refuses_a_foreign_checkpoint_before_any_actor_starts(tmp_path, capsys, resume) -> None:
    from orchestrator.cli.run import run_cmd

    ckpt = _checkpoint(tmp_path / "run" / "ckpt", SMALL)
    other = _hf_folder(tmp_path / "other", OTHER)  # only a config.json: the refusal comes before the tokenizer
    assert not ray.is_initialized()
    rc = run_cmd(_cli_args(tmp_path, other, str(ckpt) if resume == "explicit" else "auto"))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("input error: checkpoint ") and "first difference: hidden_size" in err
    assert not ray.is_initialized()  # no Ray, no actor was started


def test_checkpoint_due_by_steps_minutes_and_the_last_step() -> None:
    kw = {"total_steps": 10, "every_steps": 0, "every_minutes": 0.0, "seconds_since_last": 1e9}
    assert [s for s in range(1, 11) if checkpoint_due(s, **kw)] == [10]  # both off: the last step only
    assert [s for s in range(1, 11) if checkpoint_due(s, **{**kw, "every_steps": 4})] == [4, 8, 10]
    assert checkpoint_due(3, **{**kw, "every_minutes": 30.0, "seconds_since_last": 1800.0})
    assert not checkpoint_due(3, **{**kw, "every_minutes": 30.0, "seconds_since_last": 1799.9})
    assert checkpoint_due(3, **{**kw, "every_minutes": 0.5, "seconds_since_last": 31.0})
