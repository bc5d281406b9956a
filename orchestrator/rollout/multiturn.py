"""Multi-turn trajectories built only from token ids (token-in, token-out; case C07).

A trajectory is the first prompt's ids followed by the response part: for every turn the ids the
policy sampled (trained: loss mask 1, with the engine's logprobs) and then the ids of the
environment's reply rendered by the chat template (not trained: mask 0, logprob 0.0)::

    prompt_ids | sampled_1 | observation_1 | sampled_2 | observation_2 | ... | sampled_k
    mask:        1 1 1       0 0 0 0         1 1         0 0 0               1 1 1

Turn t+1's prompt is exactly turn t's prompt + sampled_t + observation_t (`context_ids`): the
history is never decoded and re-encoded (decoding [5, 6] to "hello" and re-encoding it to [7] is the
fault of case C07, /work/shared/cases/CASES.md).

Try it: ``python -c "from orchestrator.rollout.multiturn import TrajectoryBuilder as B; b = B(0, [1]); b.add_sampled([5, 6], [-0.7, -1.2]); print(b.finish('done'))"``
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.rollout.types import MultiTurnInfo, Trajectory

STOP_REASONS = ("done", "max_turns", "max_tokens", "env_error")


@dataclass
class MultiTurnTrajectory:
    """One multi-turn episode, as token ids with a loss mask.

    group_id: the rollout group (all samples of one prompt share it and its rollout worker).
    sample_index: index of this trajectory within its group, 0..n-1.
    prompt_ids: [P] ids of the first prompt (chat template with generation prompt).
    response_ids: [R] ids after the prompt: sampled and observation ids of every turn, in order.
    loss_mask: [R] 1 for policy-sampled ids (trained), 0 for observation/template ids.
    logprobs: [R] float; the engine's logprob for sampled ids, 0.0 where the mask is 0. The trained
        logprobs (`trained_logprobs()`) align one to one with the trained ids.
    turn_spans: per policy turn, (start, end) of its sampled ids in response_ids.
    turn_rewards: per env step, its reward (an env error leaves no reward for that step).
    turn_infos: per env step, its info dict.
    stop_reason: "done" (the env ended it), "max_turns", "max_tokens" or "env_error".
    truncated: True for "max_turns" and "max_tokens" (the episode did not end on its own).
    env_error: "" or the error text of the env call that ended the episode.
    token_versions: [R] per response id, the weight version that sampled it, -1 on observation ids and where the
        engine reported none (streamed episodes, orchestrator/rollout/partial_episode.py, report every turn's).
    """

    group_id: int
    sample_index: int
    prompt_ids: list
    response_ids: list
    loss_mask: list
    logprobs: list
    turn_spans: list
    turn_rewards: list
    turn_infos: list
    stop_reason: str
    env_error: str = ""
    extra: dict = field(default_factory=dict)
    token_versions: list = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.stop_reason in ("max_turns", "max_tokens")

    @property
    def reward(self) -> float:
        """The trajectory's reward: the sum of its turn rewards (0.0 when none)."""
        return float(sum(self.turn_rewards))

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    def trained_ids(self) -> list:
        return [t for t, m in zip(self.response_ids, self.loss_mask) if m]

    def trained_logprobs(self) -> list:
        return [lp for lp, m in zip(self.logprobs, self.loss_mask) if m]

    def to_trajectory(self, weight_version: int = -1) -> Trajectory:
        """The single-sequence `Trajectory` the trainer consumes; loss mask, turns and rewards in `.multiturn`.

        finish_reason is "stop" when the env ended the episode, else "length" (truncated or env error).
        token_versions: the episode's (-1 on observation ids) when any turn reported its versions, else empty.
        """
        info = MultiTurnInfo(loss_mask=list(self.loss_mask), turn_rewards=list(self.turn_rewards),
                             num_turns=self.num_turns, stop_reason=self.stop_reason, env_error=self.env_error,
                             sample_index=self.sample_index)
        return Trajectory(group_id=self.group_id, prompt_ids=list(self.prompt_ids),
                          response_ids=list(self.response_ids), logprobs=list(self.logprobs),
                          finish_reason="stop" if self.stop_reason == "done" else "length",
                          weight_version=weight_version, multiturn=info, extra=dict(self.extra),
                          token_versions=list(self.token_versions) if any(v >= 0 for v in self.token_versions) else [])


class TrajectoryBuilder:
    """Accumulates one trajectory turn by turn; `context_ids` is the next turn's prompt.

    Args:
        group_id, sample_index: copied onto the trajectory.
        prompt_ids: [P] first prompt ids (non-empty).
        max_tokens: limit on P + R (`EnvConfig.max_tokens`); 0 = none.
    Raises:
        ValueError: empty prompt, or a prompt of max_tokens ids or more (nothing could be sampled).
    """

    def __init__(self, group_id: int, prompt_ids: list, max_tokens: int = 0, sample_index: int = 0):
        if not prompt_ids:
            raise ValueError(f"group {group_id}: empty prompt_ids")
        if max_tokens and len(prompt_ids) >= max_tokens:
            raise ValueError(f"group {group_id}: the prompt has {len(prompt_ids)} tokens >= env.max_tokens={max_tokens}")
        self.group_id, self.sample_index, self.max_tokens = group_id, sample_index, max_tokens
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.turn_spans: list[tuple[int, int]] = []
        self.turn_rewards: list[float] = []
        self.turn_infos: list[dict] = []
        self.token_versions: list[int] = []  # per response id: the sampling weight version, -1 = none

    @property
    def context_ids(self) -> list:
        """[P + R] prompt ids + response ids so far: the prompt of the next turn (a fresh list)."""
        return self.prompt_ids + self.response_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def remaining(self) -> int:
        """Tokens left before max_tokens (a large number when there is no limit)."""
        return self.max_tokens - self.num_tokens if self.max_tokens else 1 << 62

    def add_sampled(self, ids: list, logprobs: list, versions: list | None = None) -> None:
        """Append one policy turn: [N] sampled ids with their [N] logprobs (mask 1) and, when the engine reports
        them (streamed episodes), the [N] weight versions that sampled them (else -1 each).

        Raises ValueError when the lengths differ, N is 0, a logprob is not finite or > 0, or the
        turn would exceed max_tokens (the engine must be asked for at most `remaining()` tokens).
        """
        if len(ids) != len(logprobs) or not ids:
            raise ValueError(f"group {self.group_id}: a turn needs as many logprobs as sampled ids (>= 1), "
                             f"got {len(ids)} ids and {len(logprobs)} logprobs")
        bad = [lp for lp in logprobs if not (math.isfinite(lp) and lp <= 1e-6)]
        if bad:
            raise ValueError(f"group {self.group_id}: sampled logprobs must be finite and <= 0, got {bad[:3]}")
        if len(ids) > self.remaining():
            raise ValueError(f"group {self.group_id}: {len(ids)} sampled ids exceed the {self.remaining()} "
                             f"tokens left of env.max_tokens={self.max_tokens}")
        if versions is not None and len(versions) != len(ids):
            raise ValueError(f"group {self.group_id}: {len(ids)} sampled ids but {len(versions)} token versions")
        self.token_versions += [int(v) for v in versions] if versions is not None else [-1] * len(ids)
        start = len(self.response_ids)
        self.response_ids += [int(t) for t in ids]
        self.loss_mask += [1] * len(ids)
        self.logprobs += [float(lp) for lp in logprobs]
        self.turn_spans.append((start, len(self.response_ids)))

    def add_observation(self, ids: list) -> bool:
        """Append observation/template ids (mask 0, logprob 0.0); False (nothing added) if they do not fit."""
        if len(ids) > self.remaining():
            return False
        self.response_ids += [int(t) for t in ids]
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.token_versions += [-1] * len(ids)
        return True

    def add_reward(self, reward: float, info: dict | None = None) -> None:
        self.turn_rewards.append(float(reward))
        self.turn_infos.append(dict(info or {}))

    def finish(self, stop_reason: str, env_error: str = "") -> MultiTurnTrajectory:
        """The finished trajectory. Raises ValueError for a stop_reason outside STOP_REASONS."""
        if stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason={stop_reason!r}: allowed values are {list(STOP_REASONS)}")
        return MultiTurnTrajectory(
            group_id=self.group_id, sample_index=self.sample_index, prompt_ids=list(self.prompt_ids),
            response_ids=list(self.response_ids), loss_mask=list(self.loss_mask), logprobs=list(self.logprobs),
            turn_spans=list(self.turn_spans), turn_rewards=list(self.turn_rewards),
            turn_infos=list(self.turn_infos), stop_reason=stop_reason, env_error=env_error,
            token_versions=list(self.token_versions))
