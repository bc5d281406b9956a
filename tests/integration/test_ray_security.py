"""A run's local Ray (orchestrator/runtime/ray_connect.py connect_ray) listens on 127.0.0.1 only, and its auth token file is
readable by its user only; `run.ray_loopback=false` shows the measurement has teeth (Ray's default listens on
every interface). Each case starts Ray in a fresh process with its own token file (RAY_AUTH_TOKEN_PATH), so
neither this test session's Ray nor ~/.ray is touched."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# Starts Ray through connect_ray, then prints every listening address of Ray's processes (psutil) as JSON.
SCRIPT = r"""
import json, sys, time, psutil, ray
from orchestrator.config import load_config
from orchestrator.runtime.ray_connect import connect_ray
connect_ray(load_config("configs/grpo_arith_cpu.yaml", ["run.num_cpus=1", f"run.ray_loopback={sys.argv[1]}"]))
@ray.remote
def pid():
    import os
    return os.getpid()
ray.get(pid.remote())  # a core worker up as well
time.sleep(2)
procs = {psutil.Process()}
for p in list(psutil.Process().children(recursive=True)):
    procs.add(p)
ours = {p.pid for p in procs}
listen = sorted({c.laddr.ip for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ours})
print("RESULT" + json.dumps({"listen": listen, "sockets": sum(1 for c in psutil.net_connections(kind="inet")
                              if c.status == psutil.CONN_LISTEN and c.pid in ours),
                              "node_ip": ray.util.get_node_ip_address()}))
ray.shutdown()
"""


def _start_local_ray(tmp_path: Path, loopback: bool) -> subprocess.Popen:
    """SCRIPT in a fresh process, with its own token file under `tmp_path` (`_result` reads what it printed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    env.update({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "auth_token"), "PYTHONPATH": str(ROOT)})
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(loopback).lower()], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate(timeout=180)
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, f"no result (rc {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}"
    return json.loads(line[len("RESULT"):])


def _loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


# Both local Rays at once (each its own ports and token file): one with run.ray_loopback=true, one with false.
def test_local_ray_listens_on_loopback_only_its_token_is_private_and_rays_default_does_not(tmp_path):
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    on, off = _start_local_ray(tmp_path / "on", loopback=True), _start_local_ray(tmp_path / "off", loopback=False)
    got, default = _result(on), _result(off)
    print("ray_loopback=true:", got, "\nray_loopback=false:", default)
    assert got["node_ip"] == "127.0.0.1" and got["sockets"] >= 4  # GCS, raylet, worker, agents
    assert all(_loopback(ip) for ip in got["listen"]), got
    token = tmp_path / "on" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    assert not all(_loopback(ip) for ip in default["listen"]), default  # the measurement has teeth
