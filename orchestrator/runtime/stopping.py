"""Stopping on a signal: SIGTERM (scancel, pod eviction) or SIGINT (Ctrl-C) ends the run after the current step.

    with StopOnSignal(cfg.run.stop_grace_s) as stop:     # handlers installed (main thread only)
        for step in ...:
            ...one step...
            stop.check(step, ckpt, save)                 # raises RunStopped after a signal (checkpoint saved)

The first signal lets the step (and its checkpoint) finish within `grace_s` seconds; past that, or on a
second signal (more than DUPLICATE_S after the first: `scancel` and `ray job stop` signal every process of the
job, so the controller may get one copy directly and one from the watchdog), the step is abandoned: `StepAbandoned` (a BaseException, like KeyboardInterrupt) is raised
wherever the controller is waiting and no new checkpoint is written. Exit codes: 128 + the signal number
(143 for SIGTERM, 130 for SIGINT), the shell's convention for a process ended by that signal.
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Callable, Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_S = 2.0  # a repeat within this is the same stop request delivered twice


def exit_code(signum: int) -> int:
    """128 + the signal number: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + int(signum)


class RunStopped(Exception):
    """The run stopped after step `step` on signal `signum`; `checkpoint` is the folder to resume from (None
    when there is none)."""

    def __init__(self, signum: int, step: int, checkpoint: Optional[str]):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        where = (f"resume with checkpoint.resume={checkpoint}" if checkpoint else
                 "no new checkpoint (checkpoint.on_signal=false): resume from the last one (checkpoint.resume=latest)")
        super().__init__(f"{name}: stopped after step {step}; {where}")

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


class StepAbandoned(KeyboardInterrupt):
    """The step in progress was abandoned (run.stop_grace_s passed after the signal, or a second signal).

    A KeyboardInterrupt because that is the only exception a signal handler may raise while the main thread waits
    in `ray.get`: Ray's signal check turns it into an interrupt of the wait (re-raised as a plain
    KeyboardInterrupt, which `StopOnSignal.__exit__` turns back into this), and drops any other exception, so the
    grace period and a second signal would not stop a run blocked on a long actor call."""

    def __init__(self, signum: int, why: str):
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name}: the step in progress was abandoned ({why}); no new "
                         "checkpoint was written: resume from the last one (checkpoint.resume=latest)")

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


class StopOnSignal:
    """SIGTERM/SIGINT handlers for the duration of a `with` block (a no-op off the main thread, where Python
    cannot install them). `requested` is the first signal's number (None before one arrives)."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.requested: Optional[int] = None
        self.abandoned: Optional[StepAbandoned] = None  # set when the step in progress was abandoned
        self._since = 0.0  # monotonic time of the first signal
        self._old: dict = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
            self._old[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
        return self

    def __exit__(self, exc_type, exc, _tb) -> None:
        if self._old:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, StepAbandoned) and self.abandoned is not None:
            raise self.abandoned from exc  # ray.get re-raised our abandonment as a plain KeyboardInterrupt

    def _on_signal(self, signum, _frame) -> None:
        if self.requested is not None:
            if time.monotonic() - self._since > DUPLICATE_S:
                raise self._abandon(signum, "a second signal")
            return
        self.requested, self._since = signum, time.monotonic()
        print(f"{signal.Signals(signum).name}: finishing the current step (at most run.stop_grace_s="
              f"{self.grace_s:g}s), then stopping; send it again to stop at once", flush=True)
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _on_alarm(self, _signum, _frame) -> None:
        raise self._abandon(self.requested or signal.SIGTERM, f"run.stop_grace_s={self.grace_s:g}s passed")

    def _abandon(self, signum: int, why: str) -> StepAbandoned:
        self.abandoned = StepAbandoned(signum, why)
        return self.abandoned

    def check(self, step: int, checkpoint: Optional[str], save: Optional[Callable[[int], str]]) -> None:
        """After step `step` (which wrote `checkpoint`, or None): when a signal arrived, write a checkpoint with
        `save(step)` unless the step just wrote one (or `save` is None: checkpoint.on_signal=false), then raise
        RunStopped."""
        if self.requested is None:
            return
        if checkpoint is None and save is not None:
            checkpoint = save(step)
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise RunStopped(self.requested, step, checkpoint)
