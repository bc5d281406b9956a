"""Load a run configuration: schema defaults <- YAML file <- CLI dotlist, then validate.

    cfg = load_config("configs/grpo_arith_cpu.yaml", ["rollout.n=8", "algo.kl_coef=0.01"])

Errors (all `ConfigError`, a ValueError) name the key path and what is allowed: an unknown key, a
value of the wrong type, a choice outside its allowed values, a number out of range.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
import warnings
from pathlib import Path
from typing import Optional, Sequence

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from orchestrator.algo.registry import import_plugins
from orchestrator.config.critic import check_critic
from orchestrator.config.fields import check_fields
from orchestrator.config.fp8_rollout import CORRECTION_KEYS, check_fp8_rollout, log_fp8_correction, set_keys
from orchestrator.config.paper_defaults import apply_paper_settings, declared_keys
from orchestrator.config.precision import check_precision
from orchestrator.algo.config import check_rollout_correction, corrects_staleness
from orchestrator.config.rollout_mode import STREAM, SYNC, mode_kind, resolve_rollout_mode
from orchestrator.config.sampling import check_sampling_config
from orchestrator.config.schema import Config
from orchestrator.config.sections import SECTION_CHECKS
from orchestrator.config.source_reward import check_source_rewards
from orchestrator.reward.config import RewardFunctionConfig
from orchestrator.runtime.malloc_env import check_tunables
from orchestrator.metrics.hparams import env_sourced_keys
from orchestrator.config.context_parallel import check_context_parallel  # noqa: I001 (own line: merges)


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names the key path."""


def load_config(path: Optional[str | Path] = None, overrides: Sequence[str] = (), plan_only: bool = False) -> Config:
    """Merge defaults, the YAML file at `path` (optional) and `overrides` ("a.b=value" strings). plan_only: the
    config is only planned (`rl-orch plan memory`), so the checks of what this machine can run (FP8 on its devices,
    torchao installed: config/precision.py) are skipped.

    Returns a resolved, read-only `Config` object (attribute access, typed).
    Raises ConfigError for a missing file, an unknown key, a wrong type or an invalid value.
    """
    base = _schema_defaults()  # merge copies it: never changed
    layers = []
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            layers.append(OmegaConf.load(p))
        except (yaml.YAMLError, OmegaConfBaseException) as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_problem(e)}") from None
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(f"cannot parse the overrides {list(overrides)}: {str(e).splitlines()[0]}") from None
    for layer in layers:  # `algo.dynamic_sampling=true` would fail inside OmegaConf without naming the key
        check_sections(OmegaConf.to_container(layer, resolve=False), Config)
    try:
        merged = OmegaConf.merge(base, *layers)
        _coerce_reward_functions(merged)
        from_env = env_sourced_keys(OmegaConf.to_container(merged, resolve=False))  # never logged as hparams
        OmegaConf.resolve(merged)
        merged.metrics.redact = sorted(set(merged.metrics.redact) | from_env)
    except (OmegaConfBaseException, TypeError, ValueError) as e:
        raise ConfigError(_describe(e) if isinstance(e, OmegaConfBaseException) else str(e)) from None
    _import_algo_plugins(merged)  # their paper settings too (orchestrator/config/paper_defaults.py)
    _run(lambda c: apply_paper_settings(c.algo, set_keys(layers, declared_keys(c.algo))), merged)
    try:  # rollout.mode from the deprecated keys, once (orchestrator/config/rollout_mode.py)
        note = resolve_rollout_mode(merged)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if note:
        warnings.warn(note, FutureWarning, stacklevel=2)
    validate(merged)
    if not plan_only:
        _run(check_precision, merged)  # trainer.precision=fp8: torchao, no LoRA, the GPU's FP8 support
        _run(check_fp8_rollout, merged)  # rollout.quantization / kv_cache_dtype=fp8: CUDA, a 16-bit engine
        log_fp8_correction(merged, set_keys(layers, CORRECTION_KEYS))  # FP8 rollouts: the correction, logged
    OmegaConf.set_readonly(merged, True)
    return merged  # type: ignore[return-value]


def _yaml_problem(e: Exception) -> str:
    """A YAML error in one line: what the parser was doing, what it found and where ("while constructing a mapping;
    found duplicate key rollout; line 3, column 1")."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return "; ".join(line.split(", ", 1)[1] if line.startswith("in ") and ", " in line else line for line in lines)


@functools.lru_cache(maxsize=1)
def _schema_defaults():
    """The schema's defaults as one structured config, built once per process (half the time of a load)."""
    return OmegaConf.structured(Config)


def _coerce_reward_functions(cfg) -> None:
    """`reward.functions` is a list of {name, weight}; check each item against the schema."""
    typed = []
    for i, item in enumerate(cfg.reward.functions):
        if isinstance(item, str):  # `functions: [accuracy]` is short for [{name: accuracy, weight: 1.0}]
            item = {"name": item}
        try:
            typed.append(OmegaConf.merge(OmegaConf.structured(RewardFunctionConfig), item))
        except OmegaConfBaseException as e:
            raise ConfigError(f"reward.functions[{i}]: {_describe(e)}") from None
    cfg.reward.functions = typed


def check_sections(values, cls, prefix: str = "") -> None:
    """Raise ConfigError when a YAML or override value replaces a whole config section (a dataclass of the schema)
    with something that is not a mapping, naming the section and its keys."""
    if not isinstance(values, dict):
        return
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        kind = hints.get(key)
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            continue
        if isinstance(value, dict):
            check_sections(value, kind, f"{prefix}{key}.")
        elif value is not None:
            keys = [f.name for f in dataclasses.fields(kind)]
            raise ConfigError(f"{prefix}{key}={value!r}: {prefix}{key} is a section, not a value; set its keys, e.g. "
                              f"{prefix}{key}.{keys[0]}=... (its keys: {', '.join(keys)})")


def _describe(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or ""
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return f"unknown config key {key!r}: {msg}"
    if not key:
        return msg
    if msg.startswith("Incompatible value 'None'"):  # `key=` or `key: null` on a field that takes no null
        msg = "it is empty (null), and this key needs a value"
    return f"invalid value for {key!r}: {msg}{_expected(key)}"


def _expected(key: str) -> str:
    """What `key` takes, for an error about its value: its allowed values, or its default (its type by example)."""
    from orchestrator.config.schema import CHOICES

    if key in CHOICES:
        return f"; choose one of {list(CHOICES[key])}"
    default = OmegaConf.select(_schema_defaults(), key, default=None)
    return f" (the default: {default!r})" if default is not None else ""


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _import_algo_plugins(cfg) -> None:
    """Run the `@register_...` decorators of the modules in `algo.plugins` (orchestrator/algo/registry.py)."""
    try:
        import_plugins(cfg.algo.plugins)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def validate(cfg) -> None:
    """Check choices and ranges, then each section's checks (orchestrator/config/sections.py `SECTION_CHECKS`,
    in order) and those across sections below. Raises ConfigError naming the key path and the allowed values.
    Imports `algo.plugins` first, so that the names they register are allowed."""
    _import_algo_plugins(cfg)
    _run(resolve_rollout_mode, cfg)  # idempotent: a loaded config is resolved; `with_overrides` may set new keys
    try:
        check_fields(cfg, Config)  # every field's allowed values and range (orchestrator/config/fields.py)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    optimizer_steps = cfg.trainer.total_steps * cfg.trainer.mini_batches
    if cfg.trainer.warmup_steps > optimizer_steps:
        raise ConfigError(f"trainer.warmup_steps={cfg.trainer.warmup_steps} exceeds the run's optimizer steps "
                          f"(trainer.total_steps * trainer.mini_batches = {optimizer_steps})")
    if cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens > cfg.rollout.max_model_len:
        raise ConfigError(f"data.max_prompt_tokens ({cfg.data.max_prompt_tokens}) + rollout.max_new_tokens "
                          f"({cfg.rollout.max_new_tokens}) exceed rollout.max_model_len ({cfg.rollout.max_model_len})")
    _check_packing(cfg)
    _run(check_context_parallel, cfg)
    _check_lora_targets(cfg)
    for check in SECTION_CHECKS:
        _run(check, cfg)
    batch = cfg.rollout.n * cfg.rollout.prompts_per_step
    if batch % cfg.trainer.mini_batches:
        raise ConfigError(f"trainer.mini_batches={cfg.trainer.mini_batches} must divide the global batch "
                          f"rollout.n * rollout.prompts_per_step = {batch}")
    _check_data_parallel(cfg, batch // cfg.trainer.mini_batches)
    if len(cfg.trainer.betas) != 2:
        raise ConfigError(f"trainer.betas={list(cfg.trainer.betas)} must have 2 values")
    for i, beta in enumerate(cfg.trainer.betas):
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
            raise ConfigError(f"trainer.betas[{i}]={beta!r} must be in [0, 1) (AdamW's moment decay rates)")
    _check_env(cfg)
    _run(check_source_rewards, cfg)  # built-in rewards against built-in sources' gold answers (config/source_reward.py)
    _check_async(cfg)
    _run(check_rollout_correction, cfg)  # algo.rollout_correction against algo.old_logprobs (orchestrator/algo/config.py)
    _run(check_sampling_config, cfg)  # algo.dynamic_sampling, reward.overlong_penalty (orchestrator/config/sampling.py)
    _run(check_tunables, cfg.run.glibc_tunables)


def _run(check, cfg) -> None:
    """Call a check that raises ValueError; re-raise it as ConfigError."""
    try:
        check(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_async(cfg) -> None:
    """rollout.mode one_step_off or stream (orchestrator/config/rollout_mode.py; single- or multi-turn): with
    algo.old_logprobs=trainer the staleness needs the TIS correction (algo.tis_cap set, or the sequence-level IS
    of algo.rollout_correction.mode=seq_truncate | seq_mask): the trainer's
    current weights are the proximal policy, and only w = min(exp(old - rollout), tis_cap) accounts for the
    older engine weights that sampled (decoupled PPO, Hilton et al. 2022; AReaL). algo.old_logprobs=rollout
    is accepted: the ratio pi / pi_rollout is then the importance ratio to the sampling policy itself,
    clipped like any PPO ratio, so no separate correction is needed (tis_cap is unused with it)."""
    if mode_kind(cfg) == SYNC:
        return
    if cfg.algo.max_staleness > 0 and cfg.algo.old_logprobs == "trainer" and not corrects_staleness(cfg):
        k0 = ", or algo.max_staleness=0" if mode_kind(cfg) != STREAM else ""  # stream needs k >= 1
        raise ConfigError(f"rollout.mode={cfg.rollout.mode} with algo.old_logprobs=trainer needs algo.tis_cap "
                          "(got null): without truncated importance sampling nothing corrects for batches "
                          f"generated by weights up to algo.max_staleness={cfg.algo.max_staleness} versions old; "
                          "set algo.tis_cap (e.g. 2.0), or algo.rollout_correction.mode=seq_truncate, or "
                          f"algo.old_logprobs=rollout{k0}")


def _check_env(cfg) -> None:
    """env.* ranges and choices (orchestrator/envs/env_config.py), rollout.block_size >= 0; with env.name
    set, the environment must resolve now (a typo fails here, not after the actors start)."""
    from orchestrator.envs.env import BUILTIN_ENVS, make_env, resolve_env_factory
    from orchestrator.envs.env_config import validate_env_config
    from orchestrator.envs.gymnasium_text import PREFIX as GYM_PREFIX

    try:
        validate_env_config(cfg.env, cfg.rollout.max_model_len)
        # ours and Gymnasium's: build one now so that a bad env.kwargs or a non-discrete game fails here (user envs
        # may be heavy)
        if cfg.env.name in BUILTIN_ENVS or cfg.env.name.startswith(GYM_PREFIX):
            try:
                env = make_env(cfg.env.name, OmegaConf.to_container(cfg.env.kwargs, resolve=True), "env.name")
                need = getattr(env, "min_step_timeout_s", 0.0)  # e.g. the python tool's sandbox wall_s
                if cfg.env.step_timeout_s <= need:
                    raise ValueError(f"env.step_timeout_s={cfg.env.step_timeout_s:g} must exceed {need:g}s, what one "
                                     f"call of env.name={cfg.env.name!r} may take under its env.kwargs limits")
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(str(e) if str(e).startswith("env.") else f"env.kwargs (env.name={cfg.env.name!r}): {e}") from None
        elif cfg.env.name:
            resolve_env_factory(cfg.env.name, "env.name")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.env.name and cfg.trainer.packing and cfg.env.max_tokens > cfg.trainer.micro_batch_tokens:
        raise ConfigError(f"trainer.micro_batch_tokens={cfg.trainer.micro_batch_tokens} is smaller than env.max_tokens="
                          f"{cfg.env.max_tokens}, the longest multi-turn trajectory: a packed row holds whole sequences")


def _check_packing(cfg) -> None:
    """With trainer.packing, the longest sequence must fit one row (trainer.micro_batch_tokens)."""
    budget = cfg.trainer.micro_batch_tokens
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if cfg.trainer.packing and longest > budget:
        raise ConfigError(f"trainer.micro_batch_tokens={budget} is smaller than the longest sequence, "
                          f"data.max_prompt_tokens + rollout.max_new_tokens = {longest}: a packed row holds whole "
                          "sequences; raise trainer.micro_batch_tokens or lower those")


def _check_lora_targets(cfg) -> None:
    """trainer.lora.target_modules: a non-empty list of non-empty names (their ranges are on the fields;
    targets matching no module fail at trainer start)."""
    lo = cfg.trainer.lora
    targets = list(lo.target_modules)
    if not targets or not all(isinstance(t, str) and t.strip() for t in targets):
        raise ConfigError(f"trainer.lora.target_modules={targets!r} must be a non-empty list of module names "
                          "(e.g. [q_proj, v_proj])")


def _check_data_parallel(cfg, mini_batch: int) -> None:
    """trainer.num_workers (D, FSDP2 ranks) >= 1; with D > 1 every mini-batch splits evenly over the ranks
    (each rank takes an equal share; with packing, ranks whose shards pack into fewer rows run empty
    micro-batches so that FSDP's collectives line up, actors/trainer/sharded.py). The same for the PPO critic's
    ranks, critic.num_workers, over the whole batch (orchestrator/config/critic.py)."""
    _run(check_critic, cfg)
    d = cfg.trainer.num_workers
    if d == 1:
        return
    if mini_batch % d:
        raise ConfigError(f"trainer.num_workers={d} must divide the mini-batch rollout.prompts_per_step * rollout.n "
                          f"/ trainer.mini_batches = {mini_batch}: every trainer rank takes an equal share")


