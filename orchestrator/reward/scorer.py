"""Score completions with weighted reward functions, in worker processes, under a hard timeout.

`RewardScorer` calls every reward function once per group (the samples sharing a rollout group id),
each call in a `pebble.ProcessPool` worker process with `timeout_s`: a hung call is killed and gives
0.0 for that function and group, counted in ``reward/timeouts``. Because the timeout is a process
kill, not a signal, scoring works from the main thread, a worker thread or inside a Ray actor
(case C06). An exception raised inside a reward function is logged with its traceback, counted in
``reward/errors`` and gives 0.0 for that group. A function returning the wrong number of values, or a
non-finite or non-numeric value, is a bug in the function and raises `ValueError` (case C05).

Plain class, no Ray: `actors/reward.py` wraps it as `RewardActor`.

Try it::

    with RewardScorer([("accuracy", 1.0), ("boxed_format", 0.1)]) as scorer:
        print(scorer.score(["\\\\boxed{4}", "5"], ["4", "4"], [0, 0]).rewards)   # [1.1, 0.0]
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import numbers
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from pebble import ProcessExpired, ProcessPool

from orchestrator.reward.functions import resolve_reward_fn

logger = logging.getLogger(__name__)

StartMethod = Literal["forkserver", "spawn", "fork"]


@dataclass
class RewardResult:
    """The rewards of one batch.

    Attributes:
        rewards: weighted sum of the reward functions per sample, length B, in batch order.
        per_function: raw value of each reward function per sample (keyed by the name it was given),
            each length B; 0.0 where the call timed out or raised.
        metrics: ``reward/mean``, ``reward/<name>_mean``, ``reward/timeouts``, ``reward/errors``
            (counts of (function, group) calls), ``reward/score_s`` (wall seconds).
    """

    rewards: list[float]
    per_function: dict[str, list[float]]
    metrics: dict[str, float] = field(default_factory=dict)


class _ResolveError(Exception):
    """A reward function name did not resolve in a worker; the scorer re-raises it as ValueError."""


def _call_reward_fn(name: str, completions: list[str], answers: list[str]) -> object:
    """Worker-side: resolve `name` and call it on one group; numpy/torch results become lists."""
    try:
        fn = resolve_reward_fn(name)
    except ValueError as error:
        raise _ResolveError(f"in the reward worker process: {error}") from None
    result = fn(completions, answers)
    tolist = getattr(result, "tolist", None)
    return tolist() if callable(tolist) else result


def check_reward_values(name: str, values: object, group_size: int) -> list[float]:
    """Return `values` as floats after checking they are one finite number per completion.

    Args:
        name: the reward function's name, for the error message.
        values: what the function returned for one group.
        group_size: the number of completions in that group.
    Raises:
        ValueError: naming the function, when `values` is not a list/tuple, its length differs from
            `group_size` (case C05: never broadcast), or an element is non-numeric or not finite.
    """
    if not isinstance(values, (list, tuple)):
        raise ValueError(
            f"reward function {name!r} returned a {type(values).__name__}; expected a list of "
            f"{group_size} floats"
        )
    if len(values) != group_size:
        raise ValueError(
            f"reward function {name!r} returned {len(values)} values for a group of {group_size} "
            f"completions; expected {group_size}"
        )
    checked: list[float] = []
    for i, value in enumerate(values):
        if not isinstance(value, numbers.Real):
            raise ValueError(
                f"reward function {name!r} returned a non-numeric value {value!r} "
                f"({type(value).__name__}) at position {i}"
            )
        if not math.isfinite(float(value)):
            raise ValueError(
                f"reward function {name!r} returned a non-finite value {value!r} at position {i}"
            )
        checked.append(float(value))
    return checked


def _group_positions(group_ids: list[int]) -> dict[int, list[int]]:
    """Map each group id to the batch positions of its samples, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for position, group_id in enumerate(group_ids):
        groups.setdefault(group_id, []).append(position)
    return groups


class RewardScorer:
    """Weighted reward functions scored per group in worker processes with a hard timeout.

    Args:
        functions: ``[(name, weight), ...]``; a name is a built-in (``accuracy``, ``boxed_format``) or a
            dotted path ``"pkg.module:function"`` importable by the workers. Names must be unique.
        timeout_s: seconds one call (one function, one group) may run in a worker before it is killed.
        num_workers: worker processes; groups score in parallel across them.
        mp_start_method: how workers start. ``forkserver`` (default) forks from a clean single-threaded
            server, safe inside threaded processes such as Ray actors; with ``forkserver``/``spawn`` a
            driver script must guard its entry point with ``if __name__ == "__main__":``.
    Raises:
        ValueError: empty or duplicate names, a name that does not resolve, a non-finite weight,
            ``timeout_s <= 0`` or ``num_workers < 1``.
    """

    def __init__(
        self,
        functions: list[tuple[str, float]],
        timeout_s: float = 10.0,
        num_workers: int = 2,
        mp_start_method: StartMethod = "forkserver",
    ) -> None:
        self.functions = _validate_functions(functions)
        if not timeout_s > 0:
            raise ValueError(f"reward timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"reward num_workers must be >= 1, got {num_workers}")
        self.timeout_s = float(timeout_s)
        context = multiprocessing.get_context(mp_start_method)
        if mp_start_method == "forkserver":
            context.set_forkserver_preload(["orchestrator.reward.functions"])
        self._pool: ProcessPool | None = ProcessPool(max_workers=num_workers, context=context)

    def score(
        self, completions: list[str], answers: list[str], group_ids: list[int]
    ) -> RewardResult:
        """Score a batch: every function once per group, all calls submitted at once.

        Args:
            completions: B completion texts.
            answers: B gold answers.
            group_ids: B rollout group ids; the samples of a group may be interleaved in the batch.
        Returns:
            `RewardResult` with values at the samples' original positions.
        Raises:
            ValueError: the three inputs differ in length; a function's output fails
                `check_reward_values`; a function name does not resolve in the workers.
            RuntimeError: the scorer is closed.
        """
        if not len(completions) == len(answers) == len(group_ids):
            raise ValueError(
                "reward scoring needs one answer and group id per completion; got "
                f"{len(completions)} completions, {len(answers)} answers, "
                f"{len(group_ids)} group ids"
            )
        if self._pool is None:
            raise RuntimeError("RewardScorer.score called after close()")
        start = time.perf_counter()
        groups = _group_positions(list(group_ids))
        futures: dict[tuple[str, int], Future] = {}
        for name, _ in self.functions:
            for group_id, positions in groups.items():
                args = (name, [completions[i] for i in positions], [answers[i] for i in positions])
                futures[(name, group_id)] = self._pool.schedule(
                    _call_reward_fn, args=args, timeout=self.timeout_s
                )
        try:
            per_function, timeouts, errors = self._collect(futures, groups, len(completions))
        finally:
            for future in futures.values():
                future.cancel()
        rewards = [
            sum(weight * per_function[name][i] for name, weight in self.functions)
            for i in range(len(completions))
        ]
        metrics = {f"reward/{name}_mean": _mean(values) for name, values in per_function.items()}
        metrics["reward/mean"] = _mean(rewards)
        metrics["reward/timeouts"] = float(timeouts)
        metrics["reward/errors"] = float(errors)
        metrics["reward/score_s"] = time.perf_counter() - start
        return RewardResult(rewards=rewards, per_function=per_function, metrics=metrics)

    def _collect(
        self, futures: dict[tuple[str, int], Future], groups: dict[int, list[int]], batch_size: int
    ) -> tuple[dict[str, list[float]], int, int]:
        """Wait for every call; place checked values; count timeouts and errors (those give 0.0)."""
        per_function = {name: [0.0] * batch_size for name, _ in self.functions}
        timeouts = errors = 0
        for (name, group_id), future in futures.items():
            positions = groups[group_id]
            try:
                raw = future.result()
            except _ResolveError as error:
                raise ValueError(str(error)) from error
            except TimeoutError as error:
                if hasattr(error, "traceback"):  # raised by the function itself, not by the pool
                    errors += 1
                    _log_error(name, group_id, error)
                    continue
                timeouts += 1
                logger.warning(
                    "reward function %r timed out after %.1f s on group %s; scored 0.0",
                    name, self.timeout_s, group_id,
                )
                continue
            except ProcessExpired as error:
                errors += 1
                logger.warning(
                    "reward function %r killed its worker on group %s (%s); scored 0.0",
                    name, group_id, error,
                )
                continue
            except Exception as error:  # noqa: BLE001 - counted and logged, see module docstring
                errors += 1
                _log_error(name, group_id, error)
                continue
            values = check_reward_values(name, raw, len(positions))
            for position, value in zip(positions, values):
                per_function[name][position] = value
        return per_function, timeouts, errors

    def close(self) -> None:
        """Stop the worker processes. Idempotent; `score` raises RuntimeError afterwards."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _validate_functions(functions: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Check names resolve and are unique, weights finite; return ``[(name, float(weight))]``."""
    if not functions:
        raise ValueError("RewardScorer needs at least one (name, weight) reward function")
    validated: list[tuple[str, float]] = []
    for name, weight in functions:
        resolve_reward_fn(name)  # raises ValueError naming it
        if not isinstance(weight, numbers.Real) or not math.isfinite(float(weight)):
            raise ValueError(
                f"reward function {name!r} has weight {weight!r}; expected a finite number"
            )
        if any(name == seen for seen, _ in validated):
            raise ValueError(f"reward function {name!r} is listed twice; names must be unique")
        validated.append((name, float(weight)))
    return validated


def _log_error(name: str, group_id: int, error: BaseException) -> None:
    """Log an exception raised inside a reward function, with the end of its remote traceback."""
    remote = getattr(error, "traceback", None)
    summary = "\n".join(str(remote).strip().splitlines()[-6:]) if remote else repr(error)
    logger.warning(
        "reward function %r raised %s on group %s; scored 0.0\n%s",
        name, type(error).__name__, group_id, summary,
    )


def _mean(values: list[float]) -> float:
    """Arithmetic mean; 0.0 for an empty list."""
    return sum(values) / len(values) if values else 0.0
