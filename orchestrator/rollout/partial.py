"""Partial rollouts: one sample whose generation may be interrupted by a weight update and continue on the
new weights, keeping the tokens already sampled (Kimi k1.5 sec. 2.6.2 "partial rollouts"; AReaL's
interruptible generation, Fu et al. 2025 sec. 5.1). Pure Python: `actors/rollout/interruptible.py` drives
vLLM with it, `orchestrator/rollout/stream_buffer.py` assembles finished samples into groups.

    s = PartialSample(request, index=0, max_tokens=256)
    engine.add(s.prompt_ids, s.remaining, seed=s.seed)   # continuation prompt: the prompt + the tokens so far
    s.extend(new_ids, new_logprobs, version=3)           # every token stamped with the weight version that sampled it
    ... a weight sync interrupts: the request is aborted, the weights load, the sample is added again ...
    s.extend(more_ids, more_logprobs, version=4)
    s.finish("stop"); trajectory = s.to_trajectory(text)

The behaviour logprob of each token is the one of the version that sampled it (what the importance
correction of an off-policy token needs: `algo.tis_cap`, MIS, IcePop use `Trajectory.logprobs` as the
behaviour policy's). A continuation is a new engine request whose prompt is the original prompt plus the
sampled ids, so its KV is computed by the new weights (the engines drop their prefix cache on every load:
`VLLMEngine.update_weights`), never served from KV of older weights.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.rollout.seeds import resume_seed, sample_seed
from orchestrator.rollout.types import PromptRequest, Trajectory

FINISH_REASONS = ("stop", "length")


@dataclass
class PartialSample:
    """Sample `index` of the group of `request`, generated in one or more segments.

    max_tokens: the response budget in tokens (rollout.max_new_tokens, or the request's sampling override).
    response_ids / logprobs / token_versions: per sampled token so far: its id, its behaviour logprob (float,
        nats: log_softmax(logits / T) of the version that sampled it, case C03) and that weight version.
    finish_reason: "" while generating, then "stop" (EOS or a stop id) or "length" (the budget is spent).
    interruptions: how many times a weight update interrupted it. text: the response text, set when finished.
    first_seed: the first segment's vLLM seed when the caller chose it (a streamed episode's turn:
        orchestrator/rollout/seeds.py turn_seed); None = `sample_seed(request.seed, index)`.
    """

    request: PromptRequest
    index: int
    max_tokens: int
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    finish_reason: str = ""
    interruptions: int = 0
    text: str = ""
    first_seed: Optional[int] = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.index < 0:
            raise ValueError(f"partial sample of group {self.request.group_id}: max_tokens={self.max_tokens} must be "
                             f">= 1 and index={self.index} >= 0")

    @property
    def key(self) -> str:
        """'<group id>:<index>': unique over a run (group ids are)."""
        return f"{self.request.group_id}:{self.index}"

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def prompt_ids(self) -> list[int]:
        """The next segment's prompt: the request's prompt ids + the ids sampled so far."""
        return list(self.request.prompt_ids) + list(self.response_ids)

    @property
    def remaining(self) -> int:
        """Tokens the next segment may sample (>= 0)."""
        return self.max_tokens - len(self.response_ids)

    @property
    def seed(self) -> Optional[int]:
        """The next segment's vLLM seed: `sample_seed(request.seed, index)` for the first, then
        `resume_seed(that, tokens so far)` (orchestrator/rollout/seeds.py); None for an unseeded request
        (`first_seed`, when set, replaces the first)."""
        if self.first_seed is not None:
            first = self.first_seed
        elif self.request.seed is None:
            return None
        else:
            first = sample_seed(self.request.seed, self.index)
        return resume_seed(first, len(self.response_ids)) if self.response_ids else first

    def extend(self, ids: list[int], logprobs: list[float], version: int) -> None:
        """Append one segment's new tokens, sampled by weight `version`. Raises ValueError when the lengths
        differ, the sample is done, the budget would be exceeded or the version goes backwards."""
        if len(ids) != len(logprobs):
            raise ValueError(f"sample {self.key}: {len(ids)} ids but {len(logprobs)} logprobs")
        if ids and self.done:
            raise ValueError(f"sample {self.key} is finished ({self.finish_reason}): no more tokens")
        if len(ids) > self.remaining:
            raise ValueError(f"sample {self.key}: {len(ids)} new tokens exceed the {self.remaining} left of "
                             f"max_tokens={self.max_tokens}")
        if ids and self.token_versions and version < self.token_versions[-1]:
            raise ValueError(f"sample {self.key}: version {version} is older than its last token's "
                             f"{self.token_versions[-1]}")
        self.response_ids += [int(t) for t in ids]
        self.logprobs += [float(x) for x in logprobs]
        self.token_versions += [int(version)] * len(ids)

    def finish(self, reason: str) -> None:
        """The engine finished the segment with `reason` ("stop" or "length"). A "length" with budget left is a
        segment boundary, not the end; returns without finishing then. Raises ValueError for another reason."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"sample {self.key}: finish reason {reason!r} is not one of {FINISH_REASONS}")
        if reason == "stop" or self.remaining == 0:
            self.finish_reason = reason

    def interrupted(self) -> None:
        """A weight update aborted the in-flight segment (its tokens so far are kept)."""
        self.interruptions += 1

    @property
    def first_version(self) -> Optional[int]:
        """The weight version of the first token (the oldest): the sample's staleness is measured from it."""
        return self.token_versions[0] if self.token_versions else None

    @property
    def num_versions(self) -> int:
        return len(set(self.token_versions))

    def to_trajectory(self, text: Optional[str] = None) -> Trajectory:
        """The finished sample as a Trajectory (its text: `text`, default the sample's); `weight_version` = the
        first token's version (the oldest). Raises ValueError when it is not finished."""
        if not self.done:
            raise ValueError(f"sample {self.key} is still generating ({len(self.response_ids)} of {self.max_tokens} "
                             "tokens): only finished samples become trajectories")
        r = self.request
        version = self.first_version if self.first_version is not None else -1
        return Trajectory(group_id=r.group_id, prompt_ids=list(r.prompt_ids), response_ids=list(self.response_ids),
                          logprobs=list(self.logprobs), finish_reason=self.finish_reason,
                          text=self.text if text is None else text, answer=r.answer,
                          prompt=r.prompt, weight_version=version, token_versions=list(self.token_versions))


def sample_state(sample: PartialSample) -> dict:
    """A JSON-serialisable copy of `sample` without its request (a checkpoint stores the group's request once):
    {"group_id", "index", "max_tokens", "response_ids", "logprobs", "versions": [[version, count], ...] (the
    per-token versions run-length encoded), "finish_reason", "interruptions", "text", "first_seed"}."""
    runs: list[list[int]] = []
    for v in sample.token_versions:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return {"group_id": sample.request.group_id, "index": sample.index, "max_tokens": sample.max_tokens,
            "response_ids": list(sample.response_ids), "logprobs": list(sample.logprobs), "versions": runs,
            "finish_reason": sample.finish_reason, "interruptions": sample.interruptions, "text": sample.text,
            "first_seed": sample.first_seed}


def sample_from_state(state: dict, request: PromptRequest) -> PartialSample:
    """The PartialSample of `sample_state(s)` for `request` (s's own). Raises ValueError when the versions do
    not cover the tokens one to one, or the logprobs differ in length."""
    versions = [int(v) for v, count in state["versions"] for _ in range(count)]
    ids, logprobs = state["response_ids"], state["logprobs"]
    if not len(ids) == len(logprobs) == len(versions):
        raise ValueError(f"sample {request.group_id}:{state['index']} in the checkpoint: {len(ids)} ids, "
                         f"{len(logprobs)} logprobs and {len(versions)} versions (must be equal)")
    return PartialSample(request, int(state["index"]), int(state["max_tokens"]), [int(t) for t in ids],
                         [float(x) for x in logprobs], versions, state["finish_reason"], int(state["interruptions"]),
                         state.get("text", ""), state.get("first_seed"))


def snapshot_copy(sample: PartialSample) -> PartialSample:
    """An independent copy of `sample` as it is now (its lists copied; the request shared, never mutated)."""
    return dataclasses.replace(sample, response_ids=list(sample.response_ids), logprobs=list(sample.logprobs),
                               token_versions=list(sample.token_versions))


def samples_of(request: PromptRequest, n: int, max_tokens: int) -> list[PartialSample]:
    """The n fresh partial samples of one request's group (its sampling override's n and max_new_tokens win)."""
    if request.sampling is not None:
        n, max_tokens = request.sampling.n, request.sampling.max_new_tokens
    return [PartialSample(request, i, max_tokens) for i in range(n)]
