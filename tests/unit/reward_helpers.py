"""Reward functions used by the reward tests, importable by dotted path from worker processes."""

from __future__ import annotations

import os
import resource
import signal
import time


def hang(completions: list[str], answers: list[str]) -> list[float]:
    """Never returns (case C06(b))."""
    while True:
        time.sleep(1)


def hang_on_marker(completions: list[str], answers: list[str]) -> list[float]:
    """Hangs for a group whose first completion is "HANG", else scores 1.0 per completion."""
    if completions and completions[0] == "HANG":
        hang(completions, answers)
    return [1.0] * len(completions)


def one_value(completions: list[str], answers: list[str]) -> list[float]:
    """Returns a single value whatever the group size (case C05)."""
    return [1.0]


def raise_on_marker(completions: list[str], answers: list[str]) -> list[float]:
    """Raises for a group whose first completion is "BOOM", else scores 0.5 per completion."""
    if completions and completions[0] == "BOOM":
        raise RuntimeError("reward helper exploded")
    return [0.5] * len(completions)


def returns_nan(completions: list[str], answers: list[str]) -> list[float]:
    """Returns NaN for every completion."""
    return [float("nan")] * len(completions)


def returns_strings(completions: list[str], answers: list[str]) -> list[str]:
    """Returns strings instead of floats."""
    return ["1.0"] * len(completions)


def length(completions: list[str], answers: list[str]) -> list[float]:
    """The length of each completion, to check that values land at their samples' positions."""
    return [float(len(c)) for c in completions]


def crash(completions: list[str], answers: list[str]) -> list[float]:
    """Kills its worker process."""
    os._exit(3)


def raise_timeout(completions: list[str], answers: list[str]) -> list[float]:
    """Raises its own TimeoutError (an error of the function, not a scorer timeout)."""
    raise TimeoutError("upstream service timed out")


def eat_on_marker(completions: list[str], answers: list[str]) -> list[float]:
    """For a group whose first completion is "EAT": one 8 GiB allocation (fails at once under a smaller
    memory limit). "NIBBLE": 1 MiB at a time until the limit, every piece kept. Else the worker's pid."""
    if completions and completions[0] == "EAT":
        held = bytearray(8 << 30)
        return [float(len(held))] * len(completions)
    if completions and completions[0] == "NIBBLE":
        pieces = []
        while True:
            pieces.append(bytearray(1 << 20))
    return [float(os.getpid())] * len(completions)


def sigkill_self(completions: list[str], answers: list[str]) -> list[float]:
    """Kills its own worker with SIGKILL, as the kernel's OOM killer would."""
    os.kill(os.getpid(), signal.SIGKILL)
    return [0.0] * len(completions)


def data_limit(completions: list[str], answers: list[str]) -> list[float]:
    """The worker's soft RLIMIT_DATA in bytes (-1 = unlimited), per completion."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return [float(-1 if soft == resource.RLIM_INFINITY else soft)] * len(completions)


NOT_CALLABLE = 3


def sleep_one_second(completions: list[str], answers: list[str]) -> list[float]:
    """Sleeps 1 s, then scores len(completion) per completion (a slow reward: the concurrency tests)."""
    time.sleep(1.0)
    return [float(len(c)) for c in completions]
