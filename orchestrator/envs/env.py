"""The environment protocol of multi-turn rollouts, its step result, and environment resolution.

An environment plays the other side of a conversation with the policy:

    obs = env.reset(sample)                          # the opening messages of the episode
    obs, reward, done, info = env.step(action_text)  # one reply per policy turn

`sample` is one dataset row (a dict; built-in envs read ``"prompt"``/``"answer"``/``"secret"``). An
observation is chat messages: a string (one message in the env's default role), one message dict
``{"role": ..., "content": ...}`` or a list of them. The policy's action is the decoded text of its
sampled turn; decoding is only for the environment: the trajectory keeps the sampled token ids
(orchestrator/rollout/multiturn.py, case C07).

Environments are chosen by `EnvConfig.name`: a built-in name (``"calculator"``, ``"guessing"``),
``"gymnasium:<id>"`` (a Gymnasium environment with discrete actions, envs/gymnasium_text.py) or a dotted path ``"pkg.module:Class"`` / ``"pkg.module.Class"`` to any class (or factory) with `reset` and
`step`. `EnvRunner` (env_runner.py) calls them under a per-step timeout.

Try it: ``python -c "from orchestrator.envs.env import make_env; e = make_env('guessing'); print(e.reset({'secret': 3}))"``
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, NamedTuple, Protocol, Union, runtime_checkable

from orchestrator.utils.user_code import import_user_module, split_dotted

Message = dict  # {"role": str, "content": str, ...}
Observation = Union[str, Message, list]

MOVED_FROM = "orchestrator.rollout.envs."  # now orchestrator.envs (a run config may name a built-in's old path)
BUILTIN_ENVS = {
    "calculator": "orchestrator.envs.calculator:CalculatorEnv",
    "guessing": "orchestrator.envs.guessing:GuessingEnv",
    "python": "orchestrator.envs.python_tool:PythonToolEnv",
}


class EnvStep(NamedTuple):
    """What `Environment.step` returns; a plain 4-tuple in this order is accepted too.

    observation: the environment's reply (see `Observation`); ignored when `done`.
    reward: this turn's reward (float, finite). The trajectory's reward is the sum over turns.
    done: True ends the episode.
    info: free-form dict kept per turn on the trajectory (JSON-friendly values preferred).
    """

    observation: Observation
    reward: float
    done: bool
    info: dict


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment. One instance serves one episode (one trajectory) at a time.

    Implementations may block (they run in worker threads, see env_runner.py, or, with
    env.placement=actor, in threads of an env actor, env_pool.py) but must not rely on being called from a
    particular thread. Raising, or taking longer than `EnvConfig.step_timeout_s`,
    ends only this episode (counted as an env error), never the run.
    """

    def reset(self, sample: dict) -> Observation:
        """Start an episode for dataset row `sample`; return the opening messages."""
        ...

    def step(self, action: str) -> Any:
        """Apply the policy's turn (decoded text); return `EnvStep` or (observation, reward, done, info)."""
        ...


class EnvOutputError(ValueError):
    """An environment returned something that is not a valid observation or step."""


def as_messages(observation: Observation, default_role: str = "user") -> list[Message]:
    """Normalise an observation to a non-empty list of ``{"role": str, "content": str}`` dicts.

    Raises EnvOutputError naming what is wrong (wrong type, missing role/content, empty list).
    """
    if isinstance(observation, str):
        return [{"role": default_role, "content": observation}]
    items = [observation] if isinstance(observation, dict) else observation
    if not isinstance(items, list) or not items:
        raise EnvOutputError(f"observation must be a str, a message dict or a non-empty list of them, "
                             f"got {type(observation).__name__}: {observation!r:.80}")
    for i, msg in enumerate(items):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            raise EnvOutputError(f"observation message {i} must be a dict with str 'role' and 'content', got {msg!r:.80}")
    return [dict(m) for m in items]


def check_step(result: Any) -> EnvStep:
    """Validate an env's step result and return it as an `EnvStep`.

    Raises EnvOutputError when it is not a 4-tuple, the reward is not a finite number, `done` is not
    a bool or `info` is not a dict.
    """
    if not isinstance(result, tuple) or len(result) != 4:
        raise EnvOutputError(f"step must return (observation, reward, done, info), got {result!r:.80}")
    observation, reward, done, info = result
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise EnvOutputError(f"step reward must be a finite number, got {reward!r}")
    if not isinstance(done, bool):
        raise EnvOutputError(f"step done must be a bool, got {done!r}")
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise EnvOutputError(f"step info must be a dict, got {type(info).__name__}")
    return EnvStep(observation, float(reward), done, info)


def resolve_env_factory(name: str, key: str = "env.name") -> Callable[..., Environment]:
    """Return the class (or factory) named by a built-in name or ``"pkg.module:Class"``/``"pkg.module.Class"``.

    Raises ValueError naming `key` when the name is empty, the module cannot be imported, the
    attribute is missing, or the object has no callable `reset` and `step`.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{key} is empty: give a built-in environment {sorted(BUILTIN_ENVS)} or 'pkg.module:Class'")
    if name.startswith("gymnasium:"):  # a Gymnasium environment as a text game (orchestrator/envs/gymnasium_text.py)
        from orchestrator.envs.gymnasium_text import gymnasium_env_class

        return gymnasium_env_class(name[len("gymnasium:"):])
    path = BUILTIN_ENVS.get(name, name)
    if path.startswith(MOVED_FROM):  # the built-in environments' package before 2026-12-06: still found
        path = "orchestrator.envs." + path[len(MOVED_FROM):]
    parts = split_dotted(path)
    if parts is None:
        raise ValueError(f"{key}={name!r} is neither a built-in environment {sorted(BUILTIN_ENVS)} "
                         "nor a dotted path 'pkg.module:Class'")
    module_name, attr = parts
    module = import_user_module(module_name, f"{key}={name!r}")
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"{key}={name!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory) or not all(callable(getattr(factory, m, None)) for m in ("reset", "step")):
        raise ValueError(f"{key}={name!r}: {path} must be a class with callable reset(sample) and step(action)")
    return factory


def make_env(name: str, kwargs: dict | None = None, key: str = "env.name") -> Environment:
    """Build one environment instance: `resolve_env_factory(name)(**kwargs)`.

    Raises ValueError (see `resolve_env_factory`); a TypeError from the constructor names `key`.
    """
    factory = resolve_env_factory(name, key)
    try:
        return factory(**dict(kwargs or {}))
    except TypeError as e:
        raise ValueError(f"{key}={name!r}: cannot build it with env.kwargs={dict(kwargs or {})}: {e}") from e


def with_tool_format(factory: Callable, kwargs: dict, tool_format: str) -> dict:
    """`kwargs` plus ``tool_format`` (env.tool_format resolved from the chat template) when the factory's
    signature takes a `tool_format` argument and env.kwargs does not set it already."""
    try:
        takes = "tool_format" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes = False
    return {**kwargs, "tool_format": tool_format} if takes and "tool_format" not in kwargs else kwargs
