"""Streamed multi-turn episodes (`rollout.mode=stream` with `env.name` set): one finished episode in the
shape the group buffer takes (orchestrator/rollout/stream_buffer.py, like a `PartialSample`). Pure Python.

Every policy turn of a streamed episode is one partial sample on the worker's streaming engine
(actors/rollout/stream_episodes.py): a weight update interrupts it and it continues on the new weights, so the
episode's sampled ids carry the version that sampled each of them (non-decreasing over the episode); observation
ids carry version -1 and logprob 0.0 (mask 0, never trained), as in every multi-turn trajectory
(orchestrator/rollout/multiturn.py).

    ep = EpisodeSample(request, episode, text)   # request: the group's PromptRequest; episode: MultiTurnTrajectory
    buffer.add(ep)                               # its staleness is measured from `first_version`
    trajectory = ep.to_trajectory()              # weight_version = first_version, token_versions = the episode's

An episode whose environment make/reset failed has no prompt and no trajectory (as in every multi-turn rollout,
orchestrator/rollout/agent_loop.py): it comes back as a `FailedEpisode`, which completes its slot in the group but
is never trained, so the group trains with the episodes it has (a group whose every reset failed trains none).
Every sample of a group carries the group's `GroupEnvTally` (the same object: what its env calls did), which the
controller counts once per group of a batch (`batch_env_tally`) for env/* and env.max_failed_frac.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.envs.env_runner import EnvFailure
from orchestrator.rollout.multiturn import MultiTurnTrajectory
from orchestrator.rollout.types import PromptRequest, Trajectory


@dataclass
class GroupEnvTally:
    """What the environment calls of one streamed group's episodes did (counted on the worker).

    episodes: episodes started (rollout.n); reset_failures: those whose make/reset failed (no trajectory);
    errors: failed episodes, timeouts included (an episode ends at its first failed env call, so this counts
    episodes, as env/errors does in every multi-turn rollout); timeouts: those that timed out; step_s: seconds
    inside env.step (successful steps), summed; steps: those steps; first_error: the first env error's text."""

    episodes: int = 0
    reset_failures: int = 0
    errors: int = 0
    timeouts: int = 0
    step_s: float = 0.0
    steps: int = 0
    first_error: str = ""

    def failed(self, error: EnvFailure) -> None:
        """Count one failed env call (its episode ends); first_error keeps the first that raised (not a timeout)."""
        self.errors += 1
        self.timeouts += error.kind == "timeout"
        if error.kind == "error":
            self.first_error = self.first_error or str(error)

    def add(self, other: "GroupEnvTally") -> None:
        for name in ("episodes", "reset_failures", "errors", "timeouts", "step_s", "steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.first_error = self.first_error or other.first_error

    def metrics(self) -> dict[str, float]:
        """env/step_s (mean seconds of one env.step), env/errors (timeouts included), env/timeouts and
        env/reset_failures, as in the non-streaming multi-turn row, and env/episodes (the failed fraction's
        denominator)."""
        return {"env/step_s": self.step_s / self.steps if self.steps else 0.0, "env/errors": float(self.errors),
                "env/timeouts": float(self.timeouts), "env/reset_failures": float(self.reset_failures),
                "env/episodes": float(self.episodes)}


def batch_env_tally(groups: list) -> GroupEnvTally:
    """The sum of the `GroupEnvTally` of each group (`stream_buffer.Group`: its samples share one) of a batch."""
    total = GroupEnvTally()
    for g in groups:
        tally = next((s.env for s in g.samples.values()), None)
        if tally is not None:
            total.add(tally)
    return total


@dataclass
class FailedEpisode:
    """Episode `index` of the group of `request`, whose environment make/reset failed: no prompt, no trajectory.
    It fills its slot in the group buffer (`failed`: never trained); env: the group's tally; error: the failure."""

    request: PromptRequest
    index: int
    error: str = ""
    env: GroupEnvTally = field(default_factory=GroupEnvTally)
    failed = True
    done = True
    first_version = None

    @property
    def key(self) -> str:
        return f"{self.request.group_id}:{self.index}"


@dataclass
class EpisodeSample:
    """Episode `episode.sample_index` of the group of `request`, finished (the env ended it or a limit did).

    text: the decoded sampled ids; rollout_worker: the worker that ran every turn of it; env: its group's tally.
    Raises ValueError when the episode belongs to another group or has no sampled id with a version."""

    request: PromptRequest
    episode: MultiTurnTrajectory
    text: str = ""
    rollout_worker: int = 0
    env: Optional[GroupEnvTally] = None
    failed = False

    def __post_init__(self) -> None:
        if self.episode.group_id != self.request.group_id:
            raise ValueError(f"episode of group {self.episode.group_id} handed in for group {self.request.group_id}")
        if not self.sampled_versions:
            raise ValueError(f"episode {self.key}: no sampled id carries a weight version (not a streamed episode)")

    @property
    def index(self) -> int:
        return self.episode.sample_index

    @property
    def key(self) -> str:
        """'<group id>:<index>': unique over a run (group ids are)."""
        return f"{self.request.group_id}:{self.index}"

    @property
    def done(self) -> bool:
        return True

    @property
    def finish_reason(self) -> str:
        """"stop" when the environment ended the episode, else "length" (as `MultiTurnTrajectory.to_trajectory`)."""
        return "stop" if self.episode.stop_reason == "done" else "length"

    @property
    def response_ids(self) -> list:
        """[R] sampled and observation ids."""
        return self.episode.response_ids

    @property
    def sampled_versions(self) -> list[int]:
        """The weight version of every sampled id (mask 1), in order."""
        return [v for v, m in zip(self.episode.token_versions, self.episode.loss_mask) if m and v >= 0]

    @property
    def first_version(self) -> Optional[int]:
        """The oldest sampled id's version: the episode's staleness is measured from it."""
        versions = self.sampled_versions
        return min(versions) if versions else None

    @property
    def num_versions(self) -> int:
        return len(set(self.sampled_versions))

    def to_trajectory(self) -> Trajectory:
        """The episode as the trainer's `Trajectory` (loss mask, turn rewards in `.multiturn`; the request's answer
        and prompt text; weight_version = `first_version`; token_versions per response id, -1 on observations)."""
        t = self.episode.to_trajectory(self.first_version)
        t.multiturn.rollout_worker = self.rollout_worker
        t.text, t.answer, t.prompt = self.text, self.request.answer, self.request.prompt
        return t


def episode_metrics(samples: list) -> dict[str, float]:
    """Multi-turn samples (EpisodeSamples; {} for single-turn): rollout/trajectories, rollout/turns_mean,
    rollout/turns_max, rollout/sampled_len_mean and rollout/truncated_frac (max_turns or max_tokens reached, as in
    the non-streaming row: an episode an env error ended is not truncated)."""
    episodes = [s.episode for s in samples if hasattr(s, "episode")]
    if not episodes:
        return {}
    n = len(episodes)
    return {"rollout/trajectories": float(n), "rollout/turns_mean": sum(e.num_turns for e in episodes) / n,
            "rollout/turns_max": float(max(e.num_turns for e in episodes)),
            "rollout/sampled_len_mean": sum(sum(e.loss_mask) for e in episodes) / n,
            "rollout/truncated_frac": sum(e.truncated for e in episodes) / n}
