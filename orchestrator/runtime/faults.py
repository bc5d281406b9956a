"""Actor failures survived at run time: the restart budget (`run.max_restarts`) and the errors that name a
lost actor. Pure: Ray is imported only inside `is_actor_lost`.

    budget = RestartBudget(cfg.run.max_restarts)
    budget.spend("rollout worker 1", "ActorDiedError: the actor's process was killed")   # or RestartsExhausted
    budget.used, budget.events       # restarts so far over the run, [(what, why)] in order

What is survived (docs/faults.md): a rollout worker whose process dies or whose weight load hangs past
`weight_sync.timeout_s` is replaced in its placement-group bundle, synced to the current weights, and its
in-flight groups are issued again. Every restart of any role counts against one budget per run.

Every call to a rollout worker goes through `call_engine` (one wrapper, whichever window of the step it is in:
`ENGINE_WINDOWS`), and its results through `gather_engines` or the rollout sources' recover hook, so a lost
engine becomes `EnginesLost` (the job replaces it) wherever it is lost. `fault_hook(fn)` runs `fn(window, k,
handle)` right before each such call: tests and benchmarks/faults.py kill a worker inside a chosen window with it.

    with fault_hook(lambda window, k, handle: kill(handle) if window == "probe" else None):
        controller.run()
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# The windows of a step in which a rollout worker is called (the `window` of `call_engine`): connecting a weight
# receiver, loading weights (their checksum report is the load's answer), the logprob probe, generating (training
# batches; eval), the streaming calls, and colocated sleep / wake.
ENGINE_WINDOWS = ("connect", "load", "probe", "generate", "eval", "stream_submit", "stream_snapshot", "stream_drain",
                  "sleep", "wake")
FaultHook = Callable[[str, int, Any], None]
_HOOKS: list[FaultHook] = []


class RestartsExhausted(RuntimeError):
    """An actor failed once more after `run.max_restarts` restarts: the run stops (the message says what)."""


class EnginesLost(RuntimeError):
    """Rollout engines that died or stopped answering in a call (`gather_engines`). `engines`: their indexes;
    `reasons`: {index: what happened}; `answered`: {index: result} of the engines of that call that did answer."""

    def __init__(self, engines: dict[int, str], answered: dict[int, Any] | None = None):
        self.engines = sorted(engines)
        self.reasons = dict(engines)
        self.answered = dict(answered or {})
        super().__init__("; ".join(f"rollout worker {k}: {why}" for k, why in sorted(engines.items())))


@dataclass
class RestartBudget:
    """Restarts allowed over the whole run, for every role (`run.max_restarts`)."""

    max_restarts: int
    used: int = 0
    events: list = field(default_factory=list)  # [(what, why)] of every restart, in order

    def spend(self, what: str, why: str) -> int:
        """Count one restart of `what` (e.g. "rollout worker 1") that failed with `why`. Returns the restarts
        used so far. Raises RestartsExhausted naming what failed, the earlier restarts and what to do when
        `max_restarts` restarts were already used."""
        if self.used >= self.max_restarts:
            earlier = "; ".join(f"{w} ({y})" for w, y in self.events[-3:]) or "none"
            raise RestartsExhausted(
                f"{what} failed ({why}) and the run already used its run.max_restarts={self.max_restarts} "
                f"restarts (the last ones: {earlier}). The run stops: see that actor's log (`ray logs`, "
                "out of memory, a killed process, a lost node) for the cause, then resume from the last "
                "checkpoint with checkpoint.resume=auto (raise run.max_restarts to survive more failures)")
        self.used += 1
        self.events.append((what, why))
        return self.used


def is_actor_lost(error: BaseException) -> bool:
    """Whether `error` says an actor is gone (its process died, its node was lost, it is restarting):
    Ray's RayActorError family (ActorDiedError, ActorUnavailableError). Imports Ray only when called."""
    from ray.exceptions import RayActorError

    return isinstance(error, RayActorError)


def describe(error: BaseException, limit: int = 160) -> str:
    """`Type: first line of the message`, at most `limit` characters (for logs and errors)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    out = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return out if len(out) <= limit else out[: limit - 3] + "..."


@contextmanager
def fault_hook(fn: FaultHook) -> Iterator[FaultHook]:
    """Run `fn(window, k, handle)` right before every call to a rollout worker (`call_engine`) while the block runs
    (in this process: the controller's). For fault tests: kill worker k inside one window, not after a sleep."""
    _HOOKS.append(fn)
    try:
        yield fn
    finally:
        _HOOKS.remove(fn)


def call_engine(workers, k: int, window: str, method: str, *args) -> Any:
    """`workers[k].<method>.remote(*args)`: the one way the driver calls a rollout worker. Returns the ObjectRef.
    `window` (one of `ENGINE_WINDOWS`) names the step's phase for the fault hooks. Raises ValueError for an
    unknown window."""
    if window not in ENGINE_WINDOWS:
        raise ValueError(f"call_engine: unknown window {window!r}; known: {ENGINE_WINDOWS}")
    for hook in list(_HOOKS):
        hook(window, k, workers[k])
    return getattr(workers[k], method).remote(*args)


def gather_engines(refs: dict[int, Any], timeout_s: float, what: str,
                   key: str = "weight_sync.timeout_s", hold_errors: bool = False) -> dict[int, Any]:
    """{engine index: result} of the engines' calls `refs` ({index: ObjectRef}), waiting up to `timeout_s` seconds
    (the config key `key`) for all. Raises EnginesLost naming every engine that died or did not answer in time
    (`what` names the call); any other error of a call is raised as it is. hold_errors: other errors are raised
    only when no engine was lost (a collective group: one member lost breaks the call for every member, and their
    errors are its consequence)."""
    import ray

    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done, results, lost, errors = set(ready), {}, {}, []
    for i, ref in refs.items():
        if ref not in done:
            lost[i] = f"its {what} did not answer within {key}={timeout_s:g}s"
            continue
        try:
            results[i] = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - a dead engine is reported, anything else raised
            if is_actor_lost(e):
                lost[i] = f"lost during its {what}: {describe(e)}"
            elif hold_errors:
                errors.append(e)
            else:
                raise
    if lost:
        raise EnginesLost(lost, results)
    if errors:
        raise errors[0]
    return results
