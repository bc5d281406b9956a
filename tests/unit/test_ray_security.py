"""orchestrator/runtime/ray_security.py: the local Ray's auth token file is readable by its user only; the loopback
switch is restored. (Where Ray's ports listen: tests/integration/test_ray_security.py.)"""
from __future__ import annotations

import stat

from orchestrator.config import load_config
from orchestrator.runtime.ray_security import LOOPBACK, loopback_node_ip, secure_auth_token, token_path


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_token_is_written_readable_by_its_user_only(tmp_path):
    env = {"HOME": str(tmp_path)}
    path = secure_auth_token(env)
    assert path == tmp_path / ".ray" / "auth_token" == token_path(env)
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 random bits in hex, as Ray's generator
    assert secure_auth_token(env) == path and path.read_text() == token  # kept, not replaced


def test_an_existing_world_readable_token_is_tightened(tmp_path):
    path = tmp_path / "token"
    path.write_text("abc")
    path.chmod(0o644)
    assert secure_auth_token({"HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(path)}) == path
    assert _mode(path) == 0o600 and path.read_text() == "abc"


def test_no_file_when_the_token_is_in_the_environment_or_auth_is_disabled(tmp_path):
    assert secure_auth_token({"HOME": str(tmp_path), "RAY_AUTH_TOKEN": "x" * 64}) is None
    assert secure_auth_token({"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"}) is None
    assert not (tmp_path / ".ray").exists()


def test_the_loopback_switch_is_restored():
    import ray._private.ray_constants as constants

    before = constants.ENABLE_RAY_CLUSTER
    with loopback_node_ip() as kwargs:
        assert kwargs == {"_node_ip_address": LOOPBACK} and constants.ENABLE_RAY_CLUSTER is False
    assert constants.ENABLE_RAY_CLUSTER == before
    assert load_config("configs/grpo_arith_cpu.yaml").run.ray_loopback is True
