"""Per-group scoring of fully asynchronous training (`rollout.mode=stream`,
orchestrator/rollout/stream_source.py): as soon as a group is complete in the stream's buffer, its reward scoring
(the reward actor; none multi-turn, whose rewards are the environment's) and its reference logprobs (the reference
actor, algo.kl_coef > 0) are issued as Ray calls, while the engines generate and the trainer trains. The step waits
only for what is still running when it takes the batch, then merges the groups' results in batch order.

    scores = GroupScores(issue, wait)   # issue(trajectories) -> (reward ref | None, reference ref | None)
    scores.issue(group_id, trajs)       # a complete group: its trained trajectories, by sample index
    scores.retain(live_ids)             # forget the groups dropped or discarded (never waited for)
    taken = scores.pop(batch_ids)       # the batch's groups, in batch order
    batch = scores.collect(taken, row)  # one wait: BatchScores; row["stream/score_wait_s"]

Scores are not checkpointed: a resume scores the checkpoint's complete groups again (reward functions and the
frozen reference are deterministic). A reward or reference actor that died surfaces when the batch's refs are
waited for, as the Ray error the non-streaming step's wait raises, and the supervisor (orchestrator/runtime/supervisor.py)
restarts the job from the last checkpoint as it does there (the stream and these refs are started afresh).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from orchestrator.reward.scorer import RewardResult, merge_results
from orchestrator.rollout.types import Trajectory

# one complete group's trajectories -> (the reward actor's RewardResult ref or None, the reference's ref or None)
Issue = Callable[[list[Trajectory]], tuple[Any, Any]]


@dataclass
class GroupRefs:
    """One group's scoring in flight: its trained trajectories' count and the refs issued (None: not scored here)."""

    size: int
    reward: Any = None
    reference: Any = None


@dataclass
class BatchScores:
    """A batch's scores from its groups, in trajectory order (None: not scored per group, the step computes it).

    reward: one RewardResult over the batch (`merge_results`); reference: B lists of per-token reference
    logprobs (len(response_i) floats each)."""

    reward: Optional[RewardResult]
    reference: Optional[list[list[float]]]


class GroupScores:
    """Complete groups' reward and reference calls in flight, by group id (see the module docstring).

    issue: starts one group's calls (`Issue`); wait: the job's bounded ray.get (a list of refs -> their values)."""

    def __init__(self, issue: Issue, wait: Callable):
        self._issue, self.wait = issue, wait
        self.groups: dict[int, GroupRefs] = {}

    def __contains__(self, group_id: int) -> bool:
        return group_id in self.groups

    def issue(self, group_id: int, trajs: list[Trajectory]) -> None:
        """Start group `group_id`'s calls on `trajs` (its trained trajectories in batch order; none: nothing to call).
        Raises ValueError for a group already issued."""
        if group_id in self.groups:
            raise ValueError(f"group {group_id} is already being scored")
        reward, reference = self._issue(trajs) if trajs else (None, None)
        self.groups[group_id] = GroupRefs(len(trajs), reward, reference)

    def retain(self, group_ids: Iterable[int]) -> None:
        """Forget every group not in `group_ids` (dropped over the staleness bound, or discarded)."""
        keep = set(group_ids)
        for gid in [g for g in self.groups if g not in keep]:
            del self.groups[gid]

    def pop(self, group_ids: list[int]) -> list[GroupRefs]:
        """The calls of groups `group_ids`, in that order, forgotten here. Raises ValueError naming the groups
        never issued (each group must be issued when it completes, before its batch is taken)."""
        missing = [g for g in group_ids if g not in self.groups]
        if missing:
            raise ValueError(f"groups {missing} were taken without being scored (issue each group as it completes)")
        return [self.groups.pop(g) for g in group_ids]

    def collect(self, taken: list[GroupRefs], row: dict) -> BatchScores:
        """Wait for `taken`'s results (one wait; `row["stream/score_wait_s"]`: the seconds it took) and put them
        together in batch order. Raises what `wait` raises (TimeoutError past run.phase_timeout_s, the Ray error of
        a dead actor); RuntimeError when a group of trajectories has a result and another has none."""
        rewards = [g.reward for g in taken if g.reward is not None]
        refs = [g.reference for g in taken if g.reference is not None]
        t0 = time.perf_counter()
        values = self.wait(rewards + refs) if rewards or refs else []
        row["stream/score_wait_s"] = time.perf_counter() - t0
        reward = merge_results(values[:len(rewards)]) if rewards else None
        reference = [lp for part in values[len(rewards):] for lp in part] if refs else None
        size = sum(g.size for g in taken)
        for what, got in (("reward", reward.rewards if reward else None), ("reference", reference)):
            if got is not None and len(got) != size:
                raise RuntimeError(f"per-group {what} scores cover {len(got)} of the batch's {size} trajectories")
        return BatchScores(reward, reference)
