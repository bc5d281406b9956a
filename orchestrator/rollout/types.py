"""Trajectory types: what a rollout worker returns and the controller trains on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class MultiTurnInfo:
    """What a multi-turn trajectory carries besides its ids (orchestrator/rollout/multiturn.py builds it).

    loss_mask: per response id, 1 on ids the policy sampled (trained), 0 on observation and chat-template ids
        (never trained; their logprobs are 0.0).
    turn_rewards: the environment's reward per turn; `reward` is their sum (the trajectory's reward).
    num_turns: policy turns taken. stop_reason: "done" (the env ended it), "max_turns", "max_tokens" or
        "env_error" (then `env_error` holds the error text). truncated: "max_turns" or "max_tokens".
    sample_index: the sample's index in its group; rollout_worker: the worker that ran every turn of it.
    """

    loss_mask: list[int]
    turn_rewards: list[float]
    num_turns: int
    stop_reason: str
    env_error: str = ""
    sample_index: int = 0
    rollout_worker: int = 0

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def truncated(self) -> bool:
        return self.stop_reason in ("max_turns", "max_tokens")


@dataclass
class Trajectory:
    """One sampled response to one prompt.

    group_id: the rollout group (all n samples of one prompt request share it; case C04).
    prompt_ids / response_ids: token ids, never re-tokenised text.
    logprobs: per response token, log_softmax(logits / temperature) of the sampled token (case C03).
    finish_reason: "stop" (EOS or stop string) or "length" (hit max_new_tokens).
    multiturn: the episode's turns, loss mask and environment rewards (None for a single-turn sample).
    token_versions: per response token, the weight version that sampled it (partial rollouts continue across
        weight updates: orchestrator/rollout/partial.py); empty = every token from `weight_version`.
    extra: free-form data a user's source or environment attaches (not read by the trainer).
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
    multiturn: Optional[MultiTurnInfo] = None
    extra: dict = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SamplingOverride:
    """Sampling of one request other than the rollout config's (held-out evaluation, orchestrator/eval):
    n samples at `temperature` (0 = greedy), up to `max_new_tokens` tokens, never with rollout.ignore_eos."""

    n: int
    temperature: float
    max_new_tokens: int


@dataclass
class PromptRequest:
    """One prompt to sample a group for.

    seed: the group's sampling seed (`orchestrator.rollout.seeds.group_seed`); sample i is drawn with vLLM
        seed `sample_seed(seed, i)`, so the group's samples do not depend on the engine or the batch.
        None: the engine's own random state (not reproducible across engines, batches or resumes).
    sampling: None = the rollout config's n, temperature and max_new_tokens; else this request's own.
    """

    group_id: int
    prompt_ids: list[int]
    answer: str
    prompt: str = ""
    seed: Optional[int] = None
    sampling: Optional[SamplingOverride] = None
