"""Gymnasium environments with discrete actions as multi-turn text environments: ``env.name=gymnasium:<id>``
(docs/multi-turn.md), e.g. ``gymnasium:FrozenLake-v1``, ``gymnasium:Taxi-v3``, ``gymnasium:Blackjack-v1``.

The adapter plays the Gymnasium environment ``gymnasium.make(<id>, **make_kwargs)`` through the Environment protocol
(orchestrator/envs/env.py):

- ``reset(sample)`` resets it with ``seed=sample["seed"]`` (the rollout group id: every sample of a GRPO group starts
  from the same state) and returns `intro` (what the game is and how to answer) plus the first observation.
- An observation is the environment's text rendering when it supports ``render_mode="ansi"`` (terminal colour codes
  removed; a highlighted character, e.g. FrozenLake's player, shown as ``[S]``), else ``str(observation)``.
- ``step(text)`` reads one action from the policy's reply: the last action name of `actions` in it (a whole word,
  any case), else the last whole number, which must be a valid action id (``0 <= a < action_space.n``). A reply
  with no valid action is answered with an observation saying so and `invalid_reward`; the episode goes on (its
  length is bounded by env.max_turns). The step's reward is the Gymnasium reward; ``terminated or truncated`` ends it.

Raises ValueError naming env.name / env.kwargs: for an id Gymnasium does not know, arguments gymnasium.make refuses,
a non-discrete action space or `actions` of the wrong length. The config load builds one instance
(orchestrator/config/load.py), so each of these fails before any actor starts.
"""
from __future__ import annotations

import math
import re
from typing import Optional

PREFIX = "gymnasium:"
_HIGHLIGHT = re.compile(r"\x1b\[[0-9;]*m(.)\x1b\[0m")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_INT = re.compile(r"(?<![\w.-])-?\d+(?![\w.])")


def ansi_to_text(frame: str) -> str:
    """A Gymnasium ANSI frame as plain text: a highlighted character becomes ``[c]``, other escapes go."""
    return _ESCAPE.sub("", _HIGHLIGHT.sub(r"[\1]", frame)).strip("\n")


def parse_action(text: str, n: int, actions: list[str]) -> Optional[int]:
    """The action id in `text`: the last whole-word action name (case-insensitive), else the last whole number in
    [0, n); None when there is none."""
    names = [(m.start(), i) for i, name in enumerate(actions)
             for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE)]
    if names:
        return max(names)[1]
    numbers = [int(x) for x in _INT.findall(text)]
    return numbers[-1] if numbers and 0 <= numbers[-1] < n else None


class GymnasiumTextEnv:
    """One Gymnasium environment as a text game (see the module docstring).

    Args:
        env_id: the Gymnasium id (``env.name=gymnasium:<env_id>`` sets it).
        make_kwargs: keyword arguments of ``gymnasium.make`` (e.g. ``{is_slippery: false}`` for FrozenLake).
        actions: a name per action id (e.g. ``[left, down, right, up]``); [] = numbers only.
        intro: the opening text before the first observation; "" = a generic one naming the actions.
        invalid_reward: the reward of a reply with no valid action.
    """

    ENV_ID = ""

    def __init__(self, env_id: str = "", make_kwargs: Optional[dict] = None, actions: Optional[list] = None,
                 intro: str = "", invalid_reward: float = 0.0):
        import gymnasium

        self.env_id = env_id or self.ENV_ID
        kwargs = dict(make_kwargs or {})
        try:
            self.env = gymnasium.make(self.env_id, **kwargs)
            if "render_mode" not in kwargs and "ansi" in self.env.metadata.get("render_modes", []):
                self.env.close()
                self.env = gymnasium.make(self.env_id, render_mode="ansi", **kwargs)
        except (gymnasium.error.Error, TypeError, ValueError) as e:
            raise ValueError(f"env.name={PREFIX + self.env_id!r}: gymnasium.make refuses it "
                             f"(env.kwargs.make_kwargs={kwargs}): {e}") from None
        space = self.env.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise ValueError(f"env.name={PREFIX + self.env_id!r}: its action space {space} is not Discrete; "
                             "the text adapter plays discrete actions only")
        self.n, self.actions = int(space.n), [str(a) for a in (actions or [])]
        if self.actions and len(self.actions) != self.n:
            raise ValueError(f"env.kwargs.actions={self.actions}: {self.env_id} has {self.n} actions")
        if not math.isfinite(float(invalid_reward)):
            raise ValueError(f"env.kwargs.invalid_reward={invalid_reward!r}: must be a finite number")
        self.intro, self.invalid_reward = intro, float(invalid_reward)

    def _text(self, observation) -> str:
        if getattr(self.env, "render_mode", None) == "ansi":
            return ansi_to_text(self.env.render())
        return str(observation)

    def _how(self) -> str:
        named = ", ".join(f"{i} = {name}" for i, name in enumerate(self.actions))
        return f"Reply with one action: {named}." if named else f"Reply with one action: a number from 0 to {self.n - 1}."

    def reset(self, sample: dict) -> str:
        observation, _ = self.env.reset(seed=int(sample.get("seed", 0)))
        intro = self.intro or f"You are playing {self.env_id}. {self._how()}"
        return f"{intro}\n\n{self._text(observation)}"

    def step(self, action_text: str):
        action = parse_action(action_text, self.n, self.actions)
        if action is None:
            return f"That is not a valid action. {self._how()}", self.invalid_reward, False, {"invalid_action": True}
        observation, reward, terminated, truncated, _ = self.env.step(action)
        done = bool(terminated or truncated)
        return self._text(observation), float(reward), done, {"action": action, "truncated": bool(truncated)}


def gymnasium_env_class(env_id: str) -> type:
    """A `GymnasiumTextEnv` subclass bound to `env_id` (what ``env.name=gymnasium:<env_id>`` resolves to).

    Raises ValueError naming env.name when Gymnasium is not installed or does not know `env_id` (checked at config
    load; the action space is checked when an instance is built)."""
    try:
        import gymnasium

        gymnasium.spec(env_id)
    except ImportError as e:
        raise ValueError(f"env.name={PREFIX + env_id!r}: Gymnasium is not installed (pip install gymnasium): {e}") from None
    except gymnasium.error.Error as e:
        raise ValueError(f"env.name={PREFIX + env_id!r}: {e}") from None
    name = "Gymnasium_" + re.sub(r"\W", "_", env_id)
    return type(name, (GymnasiumTextEnv,), {"ENV_ID": env_id})
