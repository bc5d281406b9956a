"""orchestrator/utils/user_code.py: a user's module named by a config key, split and imported; both failures name
the key and the module (the config keys that use it have tests of their own wording: test_config.py,
test_extending_sink.py, test_extending_rollout_mode.py, test_envs.py)."""
from __future__ import annotations

import sys

import pytest

from orchestrator.utils.user_code import import_user_module, split_dotted


@pytest.mark.parametrize("path, parts", [
    ("pkg.mod:Cls", ("pkg.mod", "Cls")), ("pkg.mod:obj.attr", ("pkg.mod", "obj.attr")),
    ("pkg.mod.Cls", ("pkg.mod", "Cls")), ("plain", None),
])
def test_split_dotted(path, parts):
    assert split_dotted(path) == parts


def test_a_missing_module_and_one_that_raises_name_the_key(tmp_path, monkeypatch):
    assert import_user_module("json", "k='json'") is sys.modules["json"]
    with pytest.raises(ValueError, match=r"^k='no_such_pkg_x': cannot import module 'no_such_pkg_x' \(No module"):
        import_user_module("no_such_pkg_x", "k='no_such_pkg_x'")
    (tmp_path / "user_code_boom.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^k: importing 'user_code_boom' raised RuntimeError: boom$") as info:
        import_user_module("user_code_boom", "k")
    assert isinstance(info.value.__cause__, RuntimeError)  # the traceback is kept


def test_a_failing_import_inside_the_users_module_keeps_its_traceback(tmp_path, monkeypatch):
    (tmp_path / "user_code_needs_dep.py").write_text("import no_such_dependency_x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"cannot import module 'user_code_needs_dep' \(No module named "
                                         r"'no_such_dependency_x'\)") as info:
        import_user_module("user_code_needs_dep", "k")
    assert isinstance(info.value.__cause__, ImportError)  # where inside the user's module it failed
    with pytest.raises(ValueError) as missing:
        import_user_module("no_such_pkg_y.mod", "k")
    assert missing.value.__cause__ is None  # the module itself is missing: nothing more to show
