"""Streamed multi-turn episodes (`rollout.partial_rollout=true` with `env.name` set): one finished episode in the
shape the group buffer takes (orchestrator/rollout/stream_buffer.py, like a `PartialSample`). Pure Python.

Every policy turn of a streamed episode is one partial sample on the worker's streaming engine
(actors/rollout/stream_episodes.py): a weight update interrupts it and it continues on the new weights, so the
episode's sampled ids carry the version that sampled each of them (non-decreasing over the episode); observation
ids carry version -1 and logprob 0.0 (mask 0, never trained), as in every multi-turn trajectory
(orchestrator/rollout/multiturn.py).

    ep = EpisodeSample(request, episode, text)   # request: the group's PromptRequest; episode: MultiTurnTrajectory
    buffer.add(ep)                               # its staleness is measured from `first_version`
    trajectory = ep.to_trajectory()              # weight_version = first_version, token_versions = the episode's
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.rollout.multiturn import MultiTurnTrajectory
from orchestrator.rollout.types import PromptRequest, Trajectory


@dataclass
class EpisodeSample:
    """Episode `episode.sample_index` of the group of `request`, finished (the env ended it or a limit did).

    text: the decoded sampled ids; rollout_worker: the worker that ran every turn of it.
    Raises ValueError when the episode belongs to another group or has no sampled id with a version."""

    request: PromptRequest
    episode: MultiTurnTrajectory
    text: str = ""
    rollout_worker: int = 0

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
