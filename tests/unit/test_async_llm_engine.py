"""rollout.engine=async_llm's engine process hygiene (actors/rollout/async_llm_engine.py), without vLLM: the engine
core's worker ends when the rollout worker's process is gone (killed, not shut down), and the environment the core's
start needs is restored for the other engines of the process.

    .venv/bin/python -m pytest tests/unit/test_async_llm_engine.py -q
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a parent that starts a child (the "engine core") running the watch, prints the child's pid, then waits to be killed
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {child!r}])
print(child.pid, flush=True)
time.sleep(600)
"""
_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from actors.rollout.async_llm_engine import _exit_with_parent
_exit_with_parent(None)
print("watching", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_engine_core_ends_when_the_rollout_workers_process_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT.format(child=_CHILD.format(root=str(ROOT)))],
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "watching" and _alive(child)  # (the child shares the pipe)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), "the orphaned engine core kept running"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_core_start_restores_the_environment_of_the_other_engines(monkeypatch):
    from actors.rollout.async_llm_engine import _start_core

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)  # restored after the test
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    seen = {}

    class _FakeAsyncLLM:
        @staticmethod
        def from_engine_args(args):
            seen.update({k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_RPC_BASE_PATH",
                                                        "VLLM_ALLOW_INSECURE_SERIALIZATION")})
            seen["ipc_exists"] = os.path.isdir(seen["VLLM_RPC_BASE_PATH"])
            return "engine"

    assert _start_core(_FakeAsyncLLM, None) == "engine"
    assert seen["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" and seen["ipc_exists"]
    assert seen["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1" == os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"]
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "VLLM_RPC_BASE_PATH" not in os.environ
    assert not os.path.exists(seen["VLLM_RPC_BASE_PATH"])  # the socket folder is gone once the core is connected
