"""Score completions with weighted reward functions, in worker processes, under a hard timeout and a memory limit.

`RewardScorer` calls every reward function once per group (the samples sharing a rollout group id),
each call in a `pebble.ProcessPool` worker process with `timeout_s`. Because the timeout is a process
kill, not a signal, scoring works from the main thread, a worker thread or inside a Ray actor (case C06).

Failures follow one policy (orchestrator/reward/failures.py): a call that times out (its worker is killed),
raises (logged with its traceback), or runs out of memory scores 0.0 for that function and group and is
counted in ``reward/timeouts``, ``reward/errors`` or ``reward/memory_errors`` (disjoint);
``reward/failed_frac`` is their sum over the calls, and `RewardResult.failures` names the functions for the
caller's stop check (`check_reward_failures`). A function returning the wrong number of values, or a
non-finite or non-numeric value, is a bug in the function and raises `ValueError` (case C05).

Memory: each worker process runs under ``setrlimit(RLIMIT_DATA, memory_limit_mb)`` (Linux >= 4.7 counts the
heap, private anonymous mappings and thread stacks: the memory the process writes). An allocation past it
fails at once: Python raises MemoryError inside the function (a memory error; the worker lives on) or C code
that cannot handle a failed allocation crashes the worker (an error, ProcessExpired); a worker killed by
SIGKILL (the kernel's OOM killer) counts as a memory error too. Either way the pool starts a new worker and
the other calls go on. RLIMIT_DATA rather than RLIMIT_AS: address space also counts reservations that use
no memory (64 MiB per glibc malloc arena, one per thread up to 8 per core; library mappings), so a 4 GiB
RLIMIT_AS refuses to start 64 threads on a many-core node while they hold 34 MiB.
Shared memory (/dev/shm, MAP_SHARED) is not counted.

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
import resource
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from pebble import ProcessExpired, ProcessPool

from orchestrator.reward.failures import FailureTally, failure_metrics
from orchestrator.reward.functions import resolve_reward_fn

logger = logging.getLogger(__name__)

StartMethod = Literal["forkserver", "spawn", "fork"]


@dataclass
class RewardResult:
    """The rewards of one batch.

    Attributes:
        rewards: weighted sum of the reward functions per sample, length B, in batch order.
        per_function: raw value of each reward function per sample (keyed by the name it was given),
            each length B; 0.0 where the call failed (timed out, raised, ran out of memory).
        metrics: ``reward/mean``, ``reward/<name>_mean``, ``reward/timeouts``, ``reward/errors``,
            ``reward/memory_errors`` (disjoint counts of (function, group) calls), ``reward/failed_frac``
            (their sum / calls), ``reward/score_s`` (wall seconds).
        failures: the failed calls by function and kind, and the number of calls (functions x groups).
    """

    rewards: list[float]
    per_function: dict[str, list[float]]
    metrics: dict[str, float] = field(default_factory=dict)
    failures: FailureTally = field(default_factory=FailureTally)


class _ResolveError(Exception):
    """A reward function name did not resolve in a worker; the scorer re-raises it as ValueError."""


class _OutOfMemory(Exception):
    """A reward function raised MemoryError in its worker (counted as a memory error)."""


def _limit_memory(limit_mb: int) -> None:
    """Worker initializer: cap the process's writable memory (RLIMIT_DATA, soft and hard) at `limit_mb` MiB;
    0 = no limit. Never above an existing hard limit (that would raise and the worker would not start)."""
    if limit_mb <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = limit_mb << 20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _call_reward_fn(name: str, completions: list[str], answers: list[str]) -> object:
    """Worker-side: resolve `name` and call it on one group; numpy/torch results become lists."""
    try:
        fn = resolve_reward_fn(name)
    except ValueError as error:
        raise _ResolveError(f"in the reward worker process: {error}") from None
    out_of_memory = False
    try:
        result = fn(completions, answers)
    except MemoryError:
        out_of_memory = True  # raised below, once the function's frames (and what they hold) are freed
    if out_of_memory:
        raise _OutOfMemory(f"reward function {name!r} ran out of memory (MemoryError) in its worker process")
    tolist = getattr(result, "tolist", None)
    return tolist() if callable(tolist) else result


def _resolve_in_worker(names: list[str]) -> None:
    """Worker-side: import every reward function (`RewardScorer.start`); a name that fails: _ResolveError."""
    for name in names:
        try:
            resolve_reward_fn(name)
        except ValueError as error:
            raise _ResolveError(f"in the reward worker process: {error}") from None


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
        memory_limit_mb: MiB of writable memory per worker process (RLIMIT_DATA, see the module docstring);
            0 = no limit.
    Raises:
        ValueError: empty or duplicate names, a name that does not resolve, a non-finite weight,
            ``timeout_s <= 0``, ``num_workers < 1`` or ``memory_limit_mb < 0``.
    """

    def __init__(
        self,
        functions: list[tuple[str, float]],
        timeout_s: float = 10.0,
        num_workers: int = 2,
        mp_start_method: StartMethod = "forkserver",
        memory_limit_mb: int = 4096,
    ) -> None:
        self.functions = _validate_functions(functions)
        if not timeout_s > 0:
            raise ValueError(f"reward timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"reward num_workers must be >= 1, got {num_workers}")
        if memory_limit_mb < 0:
            raise ValueError(f"reward memory_limit_mb must be >= 0 (0 = no limit), got {memory_limit_mb}")
        self.timeout_s = float(timeout_s)
        self.memory_limit_mb = int(memory_limit_mb)
        context = multiprocessing.get_context(mp_start_method)
        if mp_start_method == "forkserver":
            context.set_forkserver_preload(["orchestrator.reward.functions"])
        self._lock = threading.Lock()  # score may be called from several threads (RewardActor's max_concurrency)
        self._pool: ProcessPool | None = ProcessPool(max_workers=num_workers, context=context,
                                                     initializer=_limit_memory, initargs=(self.memory_limit_mb,))

    def start(self) -> float:
        """Start the workers and import every function in one, not at the first `score` (pebble starts lazily):
        the reward actor calls it while the engines start (0.6 s off a tiny model's first step on 2 cores), and a
        function that does not import in the workers fails at start. Returns its seconds. Raises ValueError (a
        name does not resolve in the worker), TimeoutError (no answer in `timeout_s`), RuntimeError (closed)."""
        t0 = time.perf_counter()
        with self._lock:
            if self._pool is None:
                raise RuntimeError("RewardScorer.start called after close()")
            future = self._pool.schedule(_resolve_in_worker, args=([name for name, _ in self.functions],),
                                         timeout=self.timeout_s)
        try:
            future.result()
        except _ResolveError as error:
            raise ValueError(str(error)) from error
        return time.perf_counter() - t0

    def score(
        self, completions: list[str], answers: list[str], group_ids: list[int]
    ) -> RewardResult:
        """Score a batch: every function once per group, all calls submitted at once. Thread-safe: calls from
        several threads share the pool (scheduling under a lock, waiting outside it) and keep their own state.

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
        start = time.perf_counter()
        groups = _group_positions(list(group_ids))
        futures: dict[tuple[str, int], Future] = {}
        with self._lock:  # the pool starts on its first schedule: not twice from two threads; not while closing
            if self._pool is None:
                raise RuntimeError("RewardScorer.score called after close()")
            for name, _ in self.functions:
                for group_id, positions in groups.items():
                    args = (name, [completions[i] for i in positions], [answers[i] for i in positions])
                    futures[(name, group_id)] = self._pool.schedule(_call_reward_fn, args=args, timeout=self.timeout_s)
        try:
            per_function, failures = self._collect(futures, groups, len(completions))
        finally:
            for future in futures.values():
                future.cancel()
        rewards = [
            sum(weight * per_function[name][i] for name, weight in self.functions)
            for i in range(len(completions))
        ]
        metrics = {f"reward/{name}_mean": _mean(values) for name, values in per_function.items()}
        metrics["reward/mean"] = _mean(rewards)
        metrics.update(failure_metrics(failures, "reward"))
        metrics["reward/score_s"] = time.perf_counter() - start
        return RewardResult(rewards=rewards, per_function=per_function, metrics=metrics, failures=failures)

    def _collect(
        self, futures: dict[tuple[str, int], Future], groups: dict[int, list[int]], batch_size: int
    ) -> tuple[dict[str, list[float]], FailureTally]:
        """Wait for every call; place checked values; count the failed calls by kind (those give 0.0)."""
        per_function = {name: [0.0] * batch_size for name, _ in self.functions}
        failures = FailureTally(calls=len(futures))
        for (name, group_id), future in futures.items():
            positions = groups[group_id]
            try:
                raw = future.result()
            except _ResolveError as error:
                raise ValueError(str(error)) from error
            except Exception as error:  # noqa: BLE001 - scored 0, counted and logged: see the module docstring
                failures.add(name, self._failure_kind(name, group_id, error))
                continue
            values = check_reward_values(name, raw, len(positions))
            for position, value in zip(positions, values):
                per_function[name][position] = value
        return per_function, failures

    def _failure_kind(self, name: str, group_id: int, error: Exception) -> str:
        """Log one failed call; return its kind: "timeout", "memory" or "error"."""
        if isinstance(error, TimeoutError) and not hasattr(error, "traceback"):  # the pool's, not the function's
            logger.warning("reward function %r timed out after %.1f s on group %s; scored 0.0",
                           name, self.timeout_s, group_id)
            return "timeout"
        if isinstance(error, _OutOfMemory):
            logger.warning("reward function %r ran out of memory on group %s (reward.memory_limit_mb=%s); "
                           "scored 0.0", name, group_id, self.memory_limit_mb or "none")
            return "memory"
        if isinstance(error, ProcessExpired):
            killed = error.exitcode == -signal.SIGKILL  # how the kernel's OOM killer ends a process
            logger.warning("reward function %r killed its worker on group %s (%s%s); scored 0.0", name, group_id,
                           error, ", SIGKILL: the kernel's OOM killer?" if killed else "")
            return "memory" if killed else "error"
        _log_error(name, group_id, error)
        return "error"

    def close(self) -> None:
        """Stop the worker processes. Idempotent; `score` raises RuntimeError afterwards."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join()

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


def merge_results(results: list[RewardResult]) -> RewardResult:
    """One batch's `RewardResult` from the results of its parts in batch order (streaming scores each group as it
    completes, orchestrator/rollout/group_scores.py), with the metrics one `RewardScorer.score` call on the whole
    batch gives: rewards and each per_function list concatenated; failures added up (calls and failed calls by
    function and kind), so ``reward/timeouts``, ``reward/errors``, ``reward/memory_errors`` and
    ``reward/failed_frac`` are the batch's; ``reward/mean`` and ``reward/<name>_mean`` recomputed over the batch's
    samples; any other ``*_mean`` (``reward/model_mean``) the sample-weighted mean of the parts'; seconds (keys
    ending ``_s``: ``reward/score_s``) summed, the reward calls' seconds (overlapping calls each count in full).

    Raises ValueError for no results, or parts whose reward functions (per_function names) differ.
    """
    if not results:
        raise ValueError("merge_results needs at least one RewardResult")
    names = list(results[0].per_function)
    for r in results:
        if sorted(r.per_function) != sorted(names):
            raise ValueError(f"merge_results: parts with different reward functions: {sorted(names)} and "
                             f"{sorted(r.per_function)}")
    rewards = [x for r in results for x in r.rewards]
    per_function = {name: [x for r in results for x in r.per_function[name]] for name in names}
    failures = FailureTally(calls=sum(r.failures.calls for r in results))
    for r in results:
        for name, kinds in r.failures.by_name.items():
            for kind, count in kinds.items():
                failures.add(name, kind, count)
    metrics: dict[str, float] = {}
    for key in dict.fromkeys(k for r in results for k in r.metrics):
        parts = [(len(r.rewards), r.metrics[key]) for r in results if key in r.metrics]
        if key.endswith("_s"):
            metrics[key] = sum(v for _, v in parts)
        else:
            metrics[key] = sum(n * v for n, v in parts) / max(sum(n for n, _ in parts), 1)
    metrics.update({f"reward/{name}_mean": _mean(per_function[name]) for name in names
                    if f"reward/{name}_mean" in metrics})
    metrics["reward/mean"] = _mean(rewards)
    metrics.update(failure_metrics(failures, "reward"))
    return RewardResult(rewards=rewards, per_function=per_function, metrics=metrics, failures=failures)
