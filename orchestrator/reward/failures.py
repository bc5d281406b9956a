"""One failure policy for the user code a step calls: reward functions and environments.

A call that raises, times out, or runs out of memory (its scorer process over `reward.memory_limit_mb`, or
killed by SIGKILL, how the kernel's OOM killer ends a process) scores 0 for what it covers (one reward function
and one group; one environment episode), is counted by kind, and the run goes on. The step's failed fraction
(failed calls / calls) decides whether the run stops: it stops when

    failed_frac > max_failed_frac          (strictly greater: 1.0 = never stop, 0.0 = stop on any failure)

because past that point most of the step's signal is the failure pattern, not the policy's completions. The
default 0.5 stops a run whose reward code broke (every call failing, the case that silently trained on
all-zero rewards before) and rides out occasional failures: a failed reward call zeroes one function for a
whole group, so that group's advantages still come from the other functions and groups.

    tally = FailureTally(calls=8)
    tally.add("pkg.mod:my_reward", "timeout")
    check_failed_frac(tally, 0.5, step=3, what="reward function calls", setting="reward.max_failed_frac")

Pure: no Ray, no processes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

FAILURE_KINDS = ("timeout", "error", "memory")  # each failed call is exactly one of these
_VERBS = {"timeout": "timed out", "error": "raised", "memory": "ran out of memory"}
_WORDS = {"timeout": ("timeout", "timeouts"), "error": ("error", "errors"), "memory": ("memory error", "memory errors")}


class TooManyFailuresError(RuntimeError):
    """More than the configured fraction of a step's reward or environment calls failed."""


@dataclass
class FailureTally:
    """Failed calls of one step, by name (a reward function, an environment) and kind.

    calls: the step's calls (failed or not); by_name: ``{name: {kind: count}}`` with kinds from
    FAILURE_KINDS.
    """

    calls: int = 0
    by_name: dict = field(default_factory=dict)

    def add(self, name: str, kind: str, count: int = 1) -> None:
        """Count `count` failed calls of `name`. Raises ValueError for a kind not in FAILURE_KINDS."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r} is not one of {FAILURE_KINDS}")
        if count:
            kinds = self.by_name.setdefault(name, {})
            kinds[kind] = kinds.get(kind, 0) + int(count)

    def count(self, kind: str) -> int:
        """Failed calls of one kind, over every name."""
        return sum(kinds.get(kind, 0) for kinds in self.by_name.values())

    @property
    def failed(self) -> int:
        return sum(self.count(kind) for kind in FAILURE_KINDS)

    @property
    def failed_frac(self) -> float:
        """failed / calls; 0.0 for a step without calls."""
        return self.failed / self.calls if self.calls else 0.0

    def describe(self) -> str:
        """``'a': 2 timeouts, 1 error; 'b': 4 memory errors`` (names in the order first failed)."""
        parts = []
        for name, kinds in self.by_name.items():
            counts = [f"{n} {_WORDS[k][n != 1]}" for k in FAILURE_KINDS if (n := kinds.get(k, 0))]
            parts.append(f"{name!r}: {', '.join(counts)}")
        return "; ".join(parts)


def failure_metrics(tally: FailureTally, prefix: str) -> dict:
    """``<prefix>/timeouts``, ``<prefix>/errors``, ``<prefix>/memory_errors`` (disjoint counts) and
    ``<prefix>/failed_frac``, as floats."""
    return {f"{prefix}/timeouts": float(tally.count("timeout")), f"{prefix}/errors": float(tally.count("error")),
            f"{prefix}/memory_errors": float(tally.count("memory")), f"{prefix}/failed_frac": tally.failed_frac}


def check_failed_frac(tally: FailureTally, max_failed_frac: float, *, step: int, what: str, setting: str,
                      advice: dict | None = None) -> None:
    """Raise TooManyFailuresError when ``tally.failed_frac > max_failed_frac``; else return None.

    Args:
        tally: the step's failed calls.
        max_failed_frac: the configured limit in [0, 1] (`setting` names its key).
        step: the step number, for the message.
        what: what a call is, e.g. "reward function calls (one function, one group)".
        setting: the config key of the limit, e.g. "reward.max_failed_frac".
        advice: {kind: what to do about failures of that kind}; the message lists the kinds that occurred.
    """
    if tally.failed_frac <= max_failed_frac:
        return
    todo = [text for kind, text in (advice or {}).items() if tally.count(kind)]
    todo.append(f"or raise {setting} (now {max_failed_frac:g}; 1.0 never stops) to train on through such steps")
    totals = ", ".join(f"{n} {verb}" for kind, verb in _VERBS.items() if (n := tally.count(kind)))
    raise TooManyFailuresError(
        f"step {step}: {tally.failed} of {tally.calls} {what} failed ({tally.failed_frac:.0%} > {setting}="
        f"{max_failed_frac:g}): {tally.describe()}; in all {totals}. What to do: " + "; ".join(todo) + ".")


def check_reward_failures(result, reward_cfg, step: int) -> None:
    """The reward phase's check: `check_failed_frac` on `result.failures` (a `RewardResult`) with
    ``reward_cfg.max_failed_frac``; the advice names reward.timeout_s and reward.memory_limit_mb.
    Raises TooManyFailuresError."""
    advice = {
        "timeout": f"make the timed-out functions faster or raise reward.timeout_s (now {reward_cfg.timeout_s:g} s)",
        "error": "fix the functions that raised (their tracebacks are in the RewardActor's log)",
        "memory": "make the functions use less memory or raise reward.memory_limit_mb "
                  f"(now {reward_cfg.memory_limit_mb}; 0 = no limit)",
    }
    check_failed_frac(result.failures, reward_cfg.max_failed_frac, step=step,
                      what="reward function calls (one function, one group)", setting="reward.max_failed_frac",
                      advice=advice)
