"""The watchdog of `rl-orch run`: the controller runs in a child process in its own session; this parent (no
Ray in it) forwards SIGTERM/SIGINT/SIGHUP to the child and, once the child has exited however it exited
(SIGKILL and the OOM killer included), ends every process still in the child's session.

Why: a controller that starts a local Ray (ray.init(address="local")) is the parent of the GCS server and the
raylet, which Ray starts with PR_SET_PDEATHSIG=SIGKILL, so they die with it. The raylet's children, the
dashboard agent and the runtime-env agent, only notice the raylet is gone (pipe closed / parent check) and then
block on the way out (reporting the raylet's death to the GCS, which died too), so after a SIGKILLed driver they
stay, re-parented to init, holding their ports and ignoring SIGTERM. They stay in the driver's session, so
killing that session leaves nothing behind. The child gets PR_SET_PDEATHSIG=SIGTERM: a SIGKILLed watchdog
stops the controller the graceful way (finish the step, checkpoint, ray.shutdown()).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

CHILD_ENV = "RL_ORCH_CONTROLLER_CHILD"  # set in the child: it runs the controller itself
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SWEEP_GRACE_S = 3.0  # SIGTERM to the leftovers, then SIGKILL after this


def is_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the watchdog's SIGKILL case is then not covered
        pass


def run_watched(argv: list[str]) -> int:
    """Run `argv` (the controller) as a child in a new session and wait for it; then end every process left in
    that session. Returns the child's exit code (128 + N when a signal N ended it)."""
    child = subprocess.Popen(argv, env={**os.environ, CHILD_ENV: "1"}, start_new_session=True,
                             preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    old = {s: signal.signal(s, lambda signum, _f: _forward(child, signum)) for s in FORWARDED}
    try:
        code = child.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        sweep(child.pid)
    return 128 - code if code < 0 else code


def _forward(child: subprocess.Popen, signum: int) -> None:
    if child.poll() is None:
        child.send_signal(signum)


def session_members(sid: int) -> list[int]:
    """Pids of the live processes in session `sid` (Linux /proc; [] elsewhere), this process excluded."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.getsid(int(entry)) == sid and not _is_zombie(int(entry)):
                pids.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return pids


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def sweep(sid: int, grace_s: float = SWEEP_GRACE_S) -> list[int]:
    """SIGTERM every process of session `sid`, SIGKILL those still there after `grace_s`. Returns the pids found."""
    found = session_members(sid)
    _signal_all(found, signal.SIGTERM)
    left = _wait_gone(sid, grace_s)
    _signal_all(left, signal.SIGKILL)
    _wait_gone(sid, 2.0)
    return found


def _wait_gone(sid: int, timeout_s: float) -> list[int]:
    """Wait up to `timeout_s` for session `sid` to be empty; returns what is left."""
    deadline = time.monotonic() + timeout_s
    left = session_members(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = session_members(sid)
    return left


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass
