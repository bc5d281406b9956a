"""benchmarks/vs_trl.py: the TRL venv's import check names a module the venv cannot import (TRL 1.13 imports
`requests` without declaring it; the benchmark failed before TRL's first step), and every module
benchmarks/trl_side.py imports is in the checked list."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import vs_trl  # noqa: E402


def test_a_module_the_venv_lacks_is_named():
    with pytest.raises(RuntimeError, match="no_such_module_xyz: ModuleNotFoundError"):
        vs_trl.check_venv_imports(Path(sys.executable), ["json", "no_such_module_xyz"])


def test_a_module_that_raises_on_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "broken_mod_xyz.py").write_text("import requests_not_installed_xyz\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="broken_mod_xyz: ModuleNotFoundError: No module named "
                                           "'requests_not_installed_xyz'"):
        vs_trl.check_venv_imports(Path(sys.executable), ["broken_mod_xyz"])


def test_importable_modules_pass():
    vs_trl.check_venv_imports(Path(sys.executable), ["json", "torch"])


def test_the_check_covers_what_trl_side_imports():
    tree = ast.parse((REPO / "benchmarks" / "trl_side.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
    third_party = {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"}
    checked = set(vs_trl.TRL_IMPORTS) | set(vs_trl.VLLM_IMPORTS)
    assert third_party - checked == set(), f"trl_side.py imports {third_party - checked} that the venv check skips"
    assert "requests" in vs_trl.TRL_PACKAGES and "trl.generation.vllm_client" in vs_trl.TRL_IMPORTS
