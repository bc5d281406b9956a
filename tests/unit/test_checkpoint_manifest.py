"""The checkpoint manifest (orchestrator/checkpoint/manifest.py) and what resume does with it: a torn file
(truncated, missing, one byte changed, an extra file) is named; auto/latest skip a torn newest checkpoint
(case C22); an explicit path that does not verify is refused; checkpoints without a manifest."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from orchestrator.checkpoint import (FORMAT_VERSION, MANIFEST, CheckpointError, CheckpointWarning, find_checkpoint,
                                     list_checkpoints, read_manifest, step_folder, verify_manifest, write_manifest)
from orchestrator.checkpoint.manifest import file_sha256

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
          "vocab_size": 97, "torch_dtype": "float32"}


def _checkpoint(root: Path, step: int, manifest: bool = True) -> Path:
    """A checkpoint folder as the trainer writes it (small stand-in files), manifest last."""
    folder = step_folder(root, step)
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "config.json").write_text(json.dumps(CONFIG))
    (folder / "policy" / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (folder / "trainer_state.pt").write_bytes(b"optimizer" * 1000)
    (folder / "state.json").write_text(json.dumps({"step": step}))
    if manifest:
        write_manifest(folder, step=step, base_model="/models/tiny")
    return folder


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    m = read_manifest(folder)
    assert m["format_version"] == FORMAT_VERSION and m["step"] == 10
    assert m["model"] == {"base_path": "/models/tiny", "identity": {k: v for k, v in CONFIG.items() if k != "torch_dtype"}}
    assert sorted(m["files"]) == ["policy/config.json", "policy/model.safetensors", "state.json", "trainer_state.pt"]
    st = m["files"]["trainer_state.pt"]
    assert st == {"size": 9000, "sha256": file_sha256(folder / "trainer_state.pt")}
    assert verify_manifest(folder) == [] and verify_manifest(folder, hashes=False) == []


def test_truncated_file_is_named_with_its_sizes(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    with open(folder / "policy" / "model.safetensors", "r+b") as f:
        f.truncate(100)
    problems = verify_manifest(folder, hashes=False)  # sizes alone catch it
    assert problems == [f"{folder / 'policy' / 'model.safetensors'}: truncated, 100 bytes where the manifest says 10240"]


def test_missing_file_is_named(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    (folder / "state.json").unlink()
    assert verify_manifest(folder) == [f"{folder / 'state.json'}: missing"]


def test_one_changed_byte_is_caught_by_the_hash_only(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    data = bytearray((folder / "trainer_state.pt").read_bytes())
    data[4321] ^= 0x01
    (folder / "trainer_state.pt").write_bytes(bytes(data))
    assert verify_manifest(folder, hashes=False) == []  # same size
    assert verify_manifest(folder) == [f"{folder / 'trainer_state.pt'}: content changed (sha256 differs from the "
                                       "manifest's)"]


def test_extra_file_bad_manifest_and_newer_format(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    (folder / "policy" / "injected.safetensors").write_bytes(b"x")
    assert verify_manifest(folder) == [f"{folder / 'policy' / 'injected.safetensors'}: not in the manifest"]
    (folder / "policy" / "injected.safetensors").unlink()
    m = read_manifest(folder)
    (folder / MANIFEST).write_text(json.dumps({**m, "format_version": FORMAT_VERSION + 1}))
    assert "format version 2 is newer" in verify_manifest(folder)[0]
    (folder / MANIFEST).write_text('{"files": {"a"')  # torn manifest itself
    assert verify_manifest(folder)[0].startswith(f"{folder / MANIFEST}: unreadable manifest")
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        read_manifest(folder)


def test_c22_resume_skips_the_newest_checkpoint_without_its_manifest(tmp_path: Path) -> None:
    # C22: step_10 complete; step_20 has the trainer's files but no manifest -> resume from 10, warning
    # naming what step_20 lacks. Taking the highest step folder (20) is the fault.
    ten = _checkpoint(tmp_path, 10)
    twenty = _checkpoint(tmp_path, 20, manifest=False)
    for resume in ("auto", "latest"):
        with pytest.warns(CheckpointWarning) as caught:
            assert find_checkpoint(resume, tmp_path) == ten
        (msg,) = [str(w.message) for w in caught]
        assert f"skipping {twenty}" in msg and f"{twenty / 'manifest.json'}: missing" in msg
        assert f"checkpoint.resume={twenty}" in msg  # how to take it anyway
    assert list_checkpoints(tmp_path) == [ten]


@pytest.mark.parametrize("tear", ["truncate", "delete", "flip"])
def test_auto_falls_back_past_a_torn_newest_checkpoint(tmp_path: Path, tear: str) -> None:
    ten, twenty = _checkpoint(tmp_path, 10), _checkpoint(tmp_path, 20)
    bad = twenty / "policy" / "model.safetensors"
    if tear == "truncate":
        bad.write_bytes(bad.read_bytes()[:-1])
    elif tear == "delete":
        bad.unlink()
    else:
        bad.write_bytes(b"\xff" + bad.read_bytes()[1:])
    with pytest.warns(CheckpointWarning, match=f"skipping {twenty}: {bad}: "):
        assert find_checkpoint("auto", tmp_path) == ten
    # sizes only: a flipped byte is not seen, the other tears are
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert find_checkpoint("auto", tmp_path, hashes=False) == (twenty if tear == "flip" else ten)


def test_auto_with_only_torn_checkpoints_starts_fresh(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    (folder / "state.json").write_text("{}")
    with pytest.warns(CheckpointWarning, match="skipping"):
        assert find_checkpoint("auto", tmp_path) is None
    with pytest.warns(CheckpointWarning) as caught:
        assert find_checkpoint("latest", tmp_path) is None
    assert "no verified checkpoint under" in str(caught[-1].message)


def test_explicit_path_that_does_not_verify_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 10)
    (folder / "trainer_state.pt").write_bytes(b"optimizer" * 999)
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(str(folder), tmp_path)
    assert isinstance(e.value, ValueError)  # `rl-orch run` reports it as an input error, exit 2
    assert f"checkpoint.resume={str(folder)!r} does not verify" in str(e.value)
    assert f"{folder / 'trainer_state.pt'}: truncated, 8991 bytes where the manifest says 9000" in str(e.value)


def test_explicit_path_without_manifest_is_resumed_with_a_warning(tmp_path: Path) -> None:
    old = _checkpoint(tmp_path, 10, manifest=False)  # written before checkpoints had manifests
    with pytest.warns(CheckpointWarning, match="has no manifest.json .* cannot be verified"):
        assert find_checkpoint(str(old), tmp_path) == old
    (old / "state.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing \['state.json'\]"):
        find_checkpoint(str(old), tmp_path)


def test_a_restart_goes_back_past_a_torn_newest_checkpoint_never_forward(tmp_path: Path) -> None:
    from orchestrator.checkpoint import restart_checkpoint

    ten, twenty, thirty = (_checkpoint(tmp_path, s) for s in (10, 20, 30))  # 30: a later run's, not this one's
    assert restart_checkpoint(twenty) == twenty
    data = bytearray((twenty / "trainer_state.pt").read_bytes())
    data[5] ^= 1  # one byte changed: same size, only the hash sees it
    (twenty / "trainer_state.pt").write_bytes(bytes(data))
    with pytest.warns(CheckpointWarning, match=r"skipping checkpoint .*step_000020: .*trainer_state.pt"):
        assert restart_checkpoint(twenty) == ten
    (ten / "policy" / "model.safetensors").write_bytes(b"torn")
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError, match=r"no checkpoint at or before .*step_000020"
                                                         r" verifies: .*trainer_state.pt.*model.safetensors"):
        restart_checkpoint(twenty)
    assert restart_checkpoint(thirty) == thirty
