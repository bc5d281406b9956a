"""Actor failures survived at run time: the restart budget (`run.max_restarts`) and the errors that name a
lost actor. Pure: Ray is imported only inside `is_actor_lost`.

    budget = RestartBudget(cfg.run.max_restarts)
    budget.spend("rollout worker 1", "ActorDiedError: the actor's process was killed")   # or RestartsExhausted
    budget.used, budget.events       # restarts so far over the run, [(what, why)] in order

What is survived (docs/faults.md): a rollout worker whose process dies or whose weight load hangs past
`weight_sync.timeout_s` is replaced in its placement-group bundle, synced to the current weights, and its
in-flight groups are issued again. Every restart of any role counts against one budget per run.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class RestartsExhausted(RuntimeError):
    """An actor failed once more after `run.max_restarts` restarts: the run stops (the message says what)."""


class EnginesLost(RuntimeError):
    """Rollout engines that died or stopped answering during a weight sync. `engines`: their indexes;
    `reasons`: {index: what happened}."""

    def __init__(self, engines: dict[int, str]):
        self.engines = sorted(engines)
        self.reasons = dict(engines)
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
