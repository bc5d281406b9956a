"""orchestrator.utils.atomic.atomic_dir: a folder appears complete or not at all."""
from __future__ import annotations

import pytest

from orchestrator.utils.atomic import atomic_dir, is_temporary


def test_the_folder_appears_only_when_the_block_ends(tmp_path):
    final = tmp_path / "sub" / "v1"
    with atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("x")
        assert not final.exists() and is_temporary(tmp.name) and tmp.parent == final.parent
    assert (final / "a.txt").read_text() == "x"
    assert [p.name for p in final.parent.iterdir()] == ["v1"]


def test_an_existing_folder_is_replaced(tmp_path):
    final = tmp_path / "ckpt"
    (final / "old").mkdir(parents=True)
    with atomic_dir(final, fsync=False) as tmp:
        (tmp / "new").write_text("y")
    assert sorted(p.name for p in final.iterdir()) == ["new"]


def test_an_error_leaves_the_final_folder_untouched_and_no_temporary(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "keep").write_text("k")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_dir(final) as tmp:
            (tmp / "half").write_text("h")
            raise RuntimeError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert [p.name for p in final.iterdir()] == ["keep"]


def test_every_file_and_folder_is_fsynced_and_the_rename_too(tmp_path, monkeypatch):
    import os

    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    final = tmp_path / "ckpt"
    with atomic_dir(final) as tmp:
        (tmp / "policy").mkdir()
        (tmp / "policy" / "w.safetensors").write_text("w")
        (tmp / "manifest.json").write_text("{}")
        name = str(tmp)
    assert {f"{name}/policy/w.safetensors", f"{name}/manifest.json", f"{name}/policy", name} <= set(synced)
    assert synced[-1] == str(tmp_path)  # the parent, after the rename: the new name is on disk
