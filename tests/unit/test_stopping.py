"""SIGTERM/SIGINT handling of a run (orchestrator/runtime/stopping.py): the step finishes and a checkpoint is written,
a second signal or run.stop_grace_s abandons the step; and the watchdog of `rl-orch run`
(orchestrator/cli/watchdog.py) leaves no process of a SIGKILLed child behind."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from orchestrator.cli.watchdog import run_watched
from orchestrator.runtime.stopping import DUPLICATE_S, RunStopped, StepAbandoned, StopOnSignal


def test_sigterm_lets_the_step_finish_then_checkpoints_and_stops():
    saved = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunStopped) as info:
        with StopOnSignal(30.0) as stop:
            stop.check(1, None, saved.append)  # no signal yet: nothing happens
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested == signal.SIGTERM  # the handler ran; the "step" goes on
            stop.check(2, None, lambda step: saved.append(step) or f"ckpt/step_{step}")
    assert saved == [2] and info.value.exit_code == 143 and info.value.checkpoint == "ckpt/step_2"
    assert "resume with checkpoint.resume=ckpt/step_2" in str(info.value)
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_no_second_checkpoint_when_the_step_wrote_one_or_on_signal_is_off():
    with pytest.raises(RunStopped) as info, StopOnSignal(30.0) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        stop.check(3, "ckpt/step_3", lambda step: pytest.fail("saved twice"))
    assert info.value.exit_code == 130 and info.value.checkpoint == "ckpt/step_3"
    with pytest.raises(RunStopped, match="checkpoint.on_signal=false") as info, StopOnSignal(30.0) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        stop.check(3, None, None)
    assert info.value.checkpoint is None


def test_a_step_past_the_grace_or_a_second_signal_is_abandoned():
    with pytest.raises(StepAbandoned, match="run.stop_grace_s=0.2s passed") as info, StopOnSignal(0.2):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a step that does not finish in time
    assert info.value.exit_code == 143
    with pytest.raises(StepAbandoned, match="a second signal"), StopOnSignal(30.0) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # the same request twice (scancel + the watchdog's copy): ignored
        assert stop.requested == signal.SIGINT
        time.sleep(DUPLICATE_S + 0.2)
        os.kill(os.getpid(), signal.SIGINT)  # a real second Ctrl-C
        time.sleep(5)


def _ray_like_get(seconds: float) -> None:
    """What ray.get does with a signal handler's exception while it waits (Ray's check_signals in _raylet.pyx):
    a KeyboardInterrupt interrupts the wait and is raised again as a new, plain KeyboardInterrupt; any other
    exception is dropped and the wait goes on."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)  # the handlers run here, as in Ray's periodic PyErr_CheckSignals
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None
        except BaseException:  # noqa: BLE001 - dropped, as Ray's cdef check does
            pass


def test_the_grace_and_a_second_signal_stop_a_run_blocked_in_ray_get():
    # the step's actor call outlives the grace: the abandonment must get out of ray.get (a KeyboardInterrupt)
    # and reach the controller as StepAbandoned with SIGTERM's exit code
    with pytest.raises(StepAbandoned, match="run.stop_grace_s=0.2s passed") as info, StopOnSignal(0.2):
        os.kill(os.getpid(), signal.SIGTERM)
        _ray_like_get(10)
    assert isinstance(info.value, KeyboardInterrupt) and info.value.exit_code == 143
    t0 = time.monotonic()
    with pytest.raises(StepAbandoned, match="a second signal") as info, StopOnSignal(30.0):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(DUPLICATE_S + 0.2)
        os.kill(os.getpid(), signal.SIGTERM)
        _ray_like_get(10)
    assert info.value.exit_code == 143 and time.monotonic() - t0 < 8
    with pytest.raises(KeyboardInterrupt) as info, StopOnSignal(30.0):  # a KeyboardInterrupt of our own stays one
        raise KeyboardInterrupt()
    assert not isinstance(info.value, StepAbandoned)


CHILD = """
import os, subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
print(g.pid, flush=True)
time.sleep(0.5)
os.kill(os.getpid(), 9)
"""


def test_watchdog_ends_what_a_sigkilled_child_left(tmp_path, capfd):
    # the child starts a grandchild that ignores SIGTERM (as Ray's agents do), then SIGKILLs itself
    code = run_watched([sys.executable, "-c", CHILD])
    grandchild = int(capfd.readouterr().out.split()[0])
    assert code == 128 + 9
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    """A live process (a zombie waiting to be reaped by init counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
