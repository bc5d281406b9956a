"""Supervision: a dead or hung trainer rank, reference, reward or critic actor is survived by restarting the job from the
newest checkpoint of the run, at most `run.max_restarts` times over the run
(the job's budget, `Job.restarts`, shared with lost rollout workers: orchestrator/runtime/faults.py).

    supervise(controller, controller.run_steps)   # run_steps(extra_row_fields) runs the remaining steps

When `run_steps` raises a Ray error (an actor died: RayActorError, or a call failed because its peer died) or a
TimeoutError (`Job.wait`: a call past run.phase_timeout_s), every actor is probed with `ready()`: one that
raises is dead, one that does not answer within PROBE_TIMEOUT_S is hung. When a supervised role is among them,
`controller.restart(controller.last_checkpoint)` stops every actor, starts them again from that checkpoint (the
base model at step 0 before the first one), restores the trainer state, loader and weight version, and the steps
go on from there (a newest checkpoint that no longer verifies against its manifest is skipped for the one
before it: `restart_checkpoint`); the metrics log drops its rows past that step (they are redone once). Otherwise (no actor
found dead: a bug, a bad reward function; a rollout worker, which its own restarts handle) the error stands, and
after a SIGTERM/SIGINT (orchestrator/runtime/stopping.py) a failure abandons the step instead of restarting.
Each row carries `run/restarts`, the restarts used so far. The pure parts (budget, messages) have unit tests.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import ray

from orchestrator.checkpoint import restart_checkpoint
from orchestrator.runtime.faults import RestartBudget, RestartsExhausted
from orchestrator.runtime.stopping import StepAbandoned

SUPERVISED_ROLES = ("trainer", "reference", "reward", "critic")  # critic: algo.estimator=gae
PROBE_TIMEOUT_S = 10.0  # an actor that does not answer ready() within this is hung


@dataclass(frozen=True)
class Failure:
    """One actor found dead or hung by the probe."""

    role: str  # "trainer" | "reference" | "reward" | "critic" | "rollout"
    name: str  # e.g. "trainer rank 1", "rollout worker 0"
    state: str  # "dead" | "hung"


class RunFailedError(RuntimeError):
    """The run stopped: a supervised actor failed and run.max_restarts restarts were used."""


def supervised(failures: list[Failure]) -> list[Failure]:
    """The failures that a restart from the checkpoint handles (roles in SUPERVISED_ROLES)."""
    return [f for f in failures if f.role in SUPERVISED_ROLES]


def describe(failures: list[Failure]) -> str:
    return ", ".join(f"{f.name} {f.state}" for f in failures)


def restart_message(failures: list[Failure], error: BaseException, used: int, budget: int,
                    folder: Optional[Path], step: int) -> str:
    """The log line of a restart: what failed, the error, the restart count and where the job resumes."""
    src = f"checkpoint {folder} (step {step})" if folder is not None else "the base model (step 0, no checkpoint yet)"
    return (f"supervisor: {describe(failures)} ({type(error).__name__}: {first_line(error)}); restart {used}/"
            f"{budget} from {src}")


def give_up_message(failures: list[Failure], error: BaseException, budget: int, folder: Optional[Path]) -> str:
    """The error of a run that used all its restarts: what failed, the restarts used and what to do."""
    resume = (f"the last checkpoint is {folder}: after fixing the cause, rerun with checkpoint.resume=latest"
              if folder is not None else "no checkpoint was written (set checkpoint.every_steps)")
    return (f"{describe(failures)} ({type(error).__name__}: {first_line(error)}) after {budget} restart(s) of "
            f"run.max_restarts={budget}; {resume} (or raise run.max_restarts)")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def _ranks_named(actors, role: str) -> list:
    """(role, name, handle) of every rank of `role` ("reference" or "critic"; `<role>_ranks`, else the one actor
    `<role>`), [] when the job has none: "<role> rank r" for several, "<role> actor" for one."""
    leader = getattr(actors, role, None)
    if leader is None:
        return []
    ranks = getattr(actors, f"{role}_ranks", None) or [leader]
    return [(role, f"{role} rank {r}" if len(ranks) > 1 else f"{role} actor", a) for r, a in enumerate(ranks)]


def probe(actors) -> list[Failure]:
    """Every actor of `actors` (orchestrator.job.Actors) asked `ready()`: those that raise (dead) or do not answer
    within PROBE_TIMEOUT_S (hung). [] when `actors` is None."""
    if actors is None:
        return []
    named = [("trainer", f"trainer rank {r}", a) for r, a in enumerate(actors.trainer_ranks or [actors.trainer])]
    named += [("rollout", f"rollout worker {k}", a) for k, a in enumerate(actors.rollout)]
    named += [("reward", "reward actor", actors.reward)]
    # every rank of a context-parallel reference (actors/reference_cp.py) and of PPO's critic (algo.estimator=gae)
    named += _ranks_named(actors, "reference") + _ranks_named(actors, "critic")
    refs = [a.ready.remote() for _, _, a in named]
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    done = set(done)
    failures = []
    for (role, name, _), ref in zip(named, refs):
        if ref not in done:
            failures.append(Failure(role, name, "hung"))
            continue
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            failures.append(Failure(role, name, "dead"))
    return failures


def supervise(controller, run_steps: Callable[[dict], None]) -> int:
    """Run `run_steps({"run/restarts": n})` to the end, restarting the job (module docstring) when a supervised
    actor died or hung. Returns the restarts used. Raises RunFailedError when run.max_restarts are used up,
    StepAbandoned when the failure came while stopping on a signal, and the original error when no supervised
    actor failed."""
    budget = controller.job.restarts  # run.max_restarts over the run, shared with lost rollout workers (Job)
    while True:
        try:
            run_steps({"run/restarts": budget.used})
            return budget.used
        except (ray.exceptions.RayError, TimeoutError) as error:
            folder = restart_point(controller, error, budget)
        try:
            controller.restart(folder)
        except BaseException as e:
            e.add_note(f"supervisor: the restart from {folder or 'the base model'} failed; after fixing the cause, "
                       "rerun with checkpoint.resume=latest")
            raise


def restart_point(controller, error: BaseException, budget: RestartBudget) -> Optional[Path]:
    """After `error`: the checkpoint to restart from (None: the base model), with one restart spent and logged;
    or raise (module docstring: not a supervised failure, stopping on a signal, no restart left)."""
    stopping = getattr(controller.stop, "requested", None)
    if stopping is not None:  # SIGTERM to every process (scancel): Ray is going down too, no restart
        raise StepAbandoned(stopping, f"{type(error).__name__} while stopping: {first_line(error)}") from error
    failures = supervised(probe(controller.actors))
    if not failures:
        raise error
    # the newest checkpoint that still verifies: a torn newest one is skipped with a warning naming the file
    folder = restart_checkpoint(controller.last_checkpoint) if controller.last_checkpoint is not None else None
    try:
        budget.spend(describe(failures), f"{type(error).__name__}: {first_line(error)}")
    except RestartsExhausted:
        raise RunFailedError(give_up_message(failures, error, budget.max_restarts, folder)) from error
    print(restart_message(failures, error, budget.used, budget.max_restarts, folder, checkpoint_step(folder)),
          flush=True)
    return folder


def checkpoint_step(folder: Optional[Path]) -> int:
    """The step recorded in checkpoint `folder`'s state.json (0 for None or an unreadable file)."""
    try:
        return int(json.loads((folder / "state.json").read_text())["step"]) if folder is not None else 0
    except (OSError, ValueError, KeyError):
        return 0
