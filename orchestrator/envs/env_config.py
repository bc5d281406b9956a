"""`EnvConfig`: the `env` section of a run configuration (multi-turn rollouts), and its validation.

`Config.env` (orchestrator/config/schema.py); `validate_env_config(cfg.env)` is called by
orchestrator/config/load.py `validate` (its errors name the ``env.`` key paths). It validates itself, apart
from the field metadata of the other sections, so that this module stays importable on its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RENDER_MODES = ("strict", "incremental")
TOOL_FORMATS = ("auto", "hermes", "llama3_json", "mistral")  # as orchestrator/envs/tool_formats.py
PLACEMENTS = ("thread", "actor")


@dataclass
class EnvConfig:
    # "" = single-turn rollouts (no environment). Else a built-in environment ("calculator",
    # "guessing") or a dotted path "pkg.module:Class" to a class with reset(sample) and step(action).
    name: str = ""
    # Keyword arguments for the environment's constructor, e.g. {max_turns: 8, high: 100}.
    kwargs: dict = field(default_factory=dict)
    # Environment calls that may run at once (threads next to the rollout loop; with placement=actor,
    # threads inside each env actor).
    num_workers: int = 4
    # Where environments run: "thread" = threads inside each rollout worker; "actor" = env.num_actors Ray
    # actors per rollout worker (actors/env_actor.py), each in a bundle of the job's placement group asking
    # env.actor_cpus CPUs (so they can sit on CPU-only nodes); a hung or crashed actor ends only the episodes
    # on it and is replaced (env/actor_restarts).
    placement: str = "thread"
    # Env actors per rollout worker (placement=actor); episodes go to the actor with the fewest open ones.
    num_actors: int = 1
    # CPUs each env actor asks for (placement=actor; its placement-group bundle is {CPU: actor_cpus}).
    actor_cpus: float = 1.0
    # Seconds one env reset/step may take; longer ends that episode as an env error (counted).
    step_timeout_s: float = 10.0
    # Policy turns per trajectory; a trajectory still going after this many is marked truncated.
    max_turns: int = 4
    # Total tokens per trajectory (prompt + every sampled and observation token); reaching it
    # truncates the trajectory. Must fit rollout.max_model_len.
    max_tokens: int = 1024
    # How observation tokens are rendered with the chat template: "strict" re-renders the whole
    # history each turn and raises ChatTemplatePrefixError if the template rewrites past turns (e.g.
    # strips past <think> reasoning); "incremental" renders only the new messages after a fixed
    # dummy history (never checks the past).
    render_mode: str = "strict"
    # How tool calls are written and answered (orchestrator/envs/tool_formats.py): "hermes" (<tool_call>,
    # Qwen/Hermes/SmolLM2), "llama3_json" (a JSON turn, ipython replies), "mistral" ([TOOL_CALLS], [TOOL_RESULTS]
    # with tool_call_id), or "auto" = picked from the chat template. Passed to environments whose constructor
    # takes `tool_format` (the built-in calculator and python tools).
    tool_format: str = "auto"
    # The run stops when more than this fraction of a step's episodes end on an env error or timeout
    # (each ends its episode, counted in env/errors). 1.0 = never stop, 0.0 = on any failure.
    max_failed_frac: float = 0.5


def validate_env_config(env: EnvConfig, max_model_len: int | None = None) -> None:
    """Check ranges and choices of `env`; raise ValueError naming the key path (``env.<key>``).

    With `max_model_len` (rollout.max_model_len), also requires env.max_tokens <= max_model_len.
    The environment name itself is resolved (imported) by `env.resolve_env_factory` at start-up.
    """
    if env.num_workers < 1:
        raise ValueError(f"env.num_workers={env.num_workers}: need >= 1")
    if not env.step_timeout_s > 0:
        raise ValueError(f"env.step_timeout_s={env.step_timeout_s}: need > 0 seconds")
    if env.max_turns < 1:
        raise ValueError(f"env.max_turns={env.max_turns}: need >= 1")
    if not 0 <= env.max_failed_frac <= 1:
        raise ValueError(f"env.max_failed_frac={env.max_failed_frac}: need a fraction in [0, 1]")
    if env.max_tokens < 2:
        raise ValueError(f"env.max_tokens={env.max_tokens}: need >= 2")
    if max_model_len is not None and env.max_tokens > max_model_len:
        raise ValueError(f"env.max_tokens={env.max_tokens} > rollout.max_model_len={max_model_len}: "
                         "a trajectory must fit the engine's context")
    if env.placement not in PLACEMENTS:
        raise ValueError(f"env.placement={env.placement!r} is not allowed; choose one of {list(PLACEMENTS)}")
    if env.num_actors < 1:
        raise ValueError(f"env.num_actors={env.num_actors}: need >= 1 (env actors per rollout worker)")
    if not (0 < env.actor_cpus < float("inf")):
        raise ValueError(f"env.actor_cpus={env.actor_cpus}: need a finite number of CPUs > 0")
    if env.render_mode not in RENDER_MODES:
        raise ValueError(f"env.render_mode={env.render_mode!r} is not allowed; choose one of {list(RENDER_MODES)}")
    if env.tool_format not in TOOL_FORMATS:
        raise ValueError(f"env.tool_format={env.tool_format!r} is not allowed; choose one of {list(TOOL_FORMATS)}")
    _check_kwargs_tool_format(env)
    if not isinstance(env.kwargs, dict) and not hasattr(env.kwargs, "keys"):
        raise ValueError(f"env.kwargs must be a mapping, got {type(env.kwargs).__name__}")


def _check_kwargs_tool_format(env: EnvConfig) -> None:
    """env.tool_format is the one key for the tool format: the renderer (prompt, kept special tokens) and the
    environment must agree, so env.kwargs.tool_format is refused unless it repeats a non-auto env.tool_format."""
    given = env.kwargs.get("tool_format") if hasattr(env.kwargs, "get") else None
    if given is None or (given == env.tool_format and given != "auto"):
        return
    raise ValueError(f"env.kwargs.tool_format={given!r}: set the format with env.tool_format (one of "
                     f"{list(TOOL_FORMATS)}; now {env.tool_format!r}), which both the chat renderer and the "
                     "environment use; env.kwargs.tool_format alone would make the environment parse a format the "
                     "prompt does not teach")
