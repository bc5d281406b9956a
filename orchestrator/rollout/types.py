"""Trajectory types: what a rollout worker returns and the controller trains on."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trajectory:
    """One sampled response to one prompt.

    group_id: the rollout group (all n samples of one prompt request share it; case C04).
    prompt_ids / response_ids: token ids, never re-tokenised text.
    logprobs: per response token, log_softmax(logits / temperature) of the sampled token (case C03).
    finish_reason: "stop" (EOS or stop string) or "length" (hit max_new_tokens).
    """

    group_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    answer: str = ""
    prompt: str = ""  # the prompt's text before the chat template (for reward models and logs)
    weight_version: int = -1
    extra: dict = field(default_factory=dict)


@dataclass
class PromptRequest:
    """One prompt to sample a group for."""

    group_id: int
    prompt_ids: list[int]
    answer: str
    prompt: str = ""
