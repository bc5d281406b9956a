"""Unit tests of orchestrator.checkpoint: folder naming, completeness, finding and pruning checkpoints
(every checkpoint made here has its manifest, as the trainer writes it; torn and manifest-less folders:
tests/unit/test_checkpoint_manifest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.checkpoint import (REQUIRED, find_checkpoint, is_complete, list_checkpoints, prune_checkpoints,
                                     step_folder, write_manifest)


def _make(root: Path, step: int, complete: bool = True, skip: tuple[str, ...] = ()) -> Path:
    folder = step_folder(root, step)
    return _fill(folder, complete, skip)


def _fill(folder: Path, complete: bool = True, skip: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True)
    files = REQUIRED if complete else REQUIRED[:1]
    for f in files:
        if f in skip:
            continue
        (folder / f).parent.mkdir(parents=True, exist_ok=True)
        (folder / f).write_text("{}")
    if complete and not skip:
        write_manifest(folder, step=0, base_model="m")
    return folder


def test_required_files() -> None:
    assert REQUIRED == ("policy/config.json", "trainer_state.pt", "state.json")


def test_step_folder_naming(tmp_path: Path) -> None:
    assert step_folder(tmp_path, 0) == tmp_path / "step_000000"
    assert step_folder(tmp_path, 123) == tmp_path / "step_000123"
    assert step_folder(str(tmp_path), 999999).name == "step_999999"
    assert step_folder("runs/x", 5) == Path("runs/x/step_000005")


def test_is_complete(tmp_path: Path) -> None:
    assert is_complete(_make(tmp_path, 1))
    assert not is_complete(_make(tmp_path, 2, complete=False))
    for missing in REQUIRED:
        assert not is_complete(_fill(tmp_path / f"m_{missing.replace('/', '_')}", skip=(missing,)))
    assert not is_complete(tmp_path / "does_not_exist")


def test_list_checkpoints_oldest_first_complete_only(tmp_path: Path) -> None:
    a, b, c = _make(tmp_path, 10), _make(tmp_path, 2), _make(tmp_path, 30)
    _make(tmp_path, 40, complete=False)  # a crash mid-save of an old trainer version
    _fill(tmp_path / ".step_000050.tmp-abc123")  # the trainer's temporary folder, complete but not renamed
    (tmp_path / "step_000060").write_text("a file, not a folder")
    (tmp_path / "other").mkdir()
    assert list_checkpoints(tmp_path) == [b, a, c]


def test_list_checkpoints_missing_root(tmp_path: Path) -> None:
    assert list_checkpoints(tmp_path / "nope") == []


def test_list_checkpoints_orders_by_step_beyond_six_digits(tmp_path: Path) -> None:
    small, big = _make(tmp_path, 999_999), _make(tmp_path, 1_000_000)
    assert big.name == "step_1000000"
    assert list_checkpoints(tmp_path) == [small, big]
    assert find_checkpoint("latest", tmp_path) == big


def test_list_checkpoints_ignores_non_step_names(tmp_path: Path) -> None:
    a = _make(tmp_path, 3)
    _fill(tmp_path / "step_000009.bak")  # a user's copy: never the "latest", never pruned
    _fill(tmp_path / "step_latest")
    assert list_checkpoints(tmp_path) == [a]
    prune_checkpoints(tmp_path, keep_last=1)
    assert (tmp_path / "step_000009.bak").is_dir() and (tmp_path / "step_latest").is_dir()


def test_find_checkpoint_none(tmp_path: Path) -> None:
    _make(tmp_path, 1)
    assert find_checkpoint(None, tmp_path) is None
    assert find_checkpoint("", tmp_path) is None
    assert find_checkpoint("none", tmp_path) is None


@pytest.mark.parametrize("resume", ["latest", "auto"])
def test_find_checkpoint_latest(tmp_path: Path, resume: str) -> None:
    assert find_checkpoint("auto", tmp_path) is None  # nothing saved yet: a fresh start, no warning
    with pytest.warns(UserWarning, match="no verified checkpoint"):  # latest says it found nothing
        assert find_checkpoint("latest", tmp_path / "missing_root") is None
    _make(tmp_path, 5)
    newest = _make(tmp_path, 20)
    _make(tmp_path, 30, complete=False)  # newer, but incomplete: skipped (with a warning)
    _fill(tmp_path / ".step_000040.tmp-x")  # newer, but still temporary: not a step folder
    with pytest.warns(UserWarning, match="skipping .*step_000030"):
        assert find_checkpoint(resume, tmp_path) == newest


def test_find_checkpoint_explicit_path(tmp_path: Path) -> None:
    folder = _make(tmp_path / "elsewhere", 7)
    assert find_checkpoint(str(folder), tmp_path / "root_is_ignored") == folder


def test_find_checkpoint_incomplete_lists_missing_files(tmp_path: Path) -> None:
    folder = _fill(tmp_path / "step_000008", skip=("trainer_state.pt", "state.json"))
    with pytest.raises(FileNotFoundError) as e:
        find_checkpoint(str(folder), tmp_path)
    msg = str(e.value)
    assert f"checkpoint.resume={str(folder)!r} is not a complete checkpoint" in msg
    assert "['trainer_state.pt', 'state.json']" in msg
    assert "policy/config.json" not in msg


def test_find_checkpoint_nonexistent_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        find_checkpoint(str(tmp_path / "nope"), tmp_path)
    assert str(list(REQUIRED)) in str(e.value) and "the other values are auto, latest and none" in str(e.value)


def test_prune_keeps_newest_k(tmp_path: Path) -> None:
    folders = [_make(tmp_path, s) for s in (10, 20, 30, 40, 50)]
    incomplete = _make(tmp_path, 5, complete=False)
    torn = _make(tmp_path, 60)
    (torn / "trainer_state.pt").write_text("")  # the newest is torn: it does not count, nor is it deleted
    temp = _fill(tmp_path / ".step_000060.tmp-q")
    prune_checkpoints(tmp_path, keep_last=2)
    assert list_checkpoints(tmp_path) == folders[-2:]
    assert not any(f.exists() for f in folders[:-2])
    assert incomplete.is_dir() and temp.is_dir() and torn.is_dir()  # not verified checkpoints: left alone
    prune_checkpoints(tmp_path, keep_last=2)  # idempotent
    assert list_checkpoints(tmp_path) == folders[-2:]
    prune_checkpoints(tmp_path, keep_last=5)  # more than exist: nothing deleted
    assert list_checkpoints(tmp_path) == folders[-2:]


@pytest.mark.parametrize("keep_last", [0, -1])
def test_prune_non_positive_keeps_all(tmp_path: Path, keep_last: int) -> None:
    folders = [_make(tmp_path, s) for s in (1, 2, 3)]
    prune_checkpoints(tmp_path, keep_last=keep_last)
    assert list_checkpoints(tmp_path) == folders


def test_prune_missing_root(tmp_path: Path) -> None:
    prune_checkpoints(tmp_path / "nope", keep_last=1)  # nothing to do, no error
    assert not (tmp_path / "nope").exists()
