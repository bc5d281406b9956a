"""Unit tests of orchestrator.config: loading, overrides, and validation errors that name the key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf.errors import ReadonlyConfigError

from orchestrator.config import ConfigError, load_config, validate
from orchestrator.config.schema import CHOICES

REPO = Path(__file__).resolve().parents[2]
CPU_YAML = REPO / "configs" / "grpo_arith_cpu.yaml"


def _load(*overrides: str):
    return load_config(CPU_YAML, list(overrides))


def test_defaults_without_a_file() -> None:
    cfg = load_config()
    assert cfg.run.name == "grpo_arith"
    assert cfg.rollout.n == 8
    assert cfg.rollout.prompts_per_step == 4
    assert cfg.algo.estimator == "grpo"
    assert cfg.algo.tis_cap == 2.0
    assert list(cfg.trainer.betas) == [0.9, 0.99]
    assert [dict(f) for f in cfg.reward.functions] == [{"name": "accuracy", "weight": 1.0}]
    # interpolations are resolved
    assert cfg.run.output_dir == "runs/grpo_arith"
    assert cfg.checkpoint.dir == "runs/grpo_arith/checkpoints"


def test_cpu_yaml_loads_and_matches_the_file() -> None:
    raw = yaml.safe_load(CPU_YAML.read_text())
    cfg = _load()
    # every key the file sets comes through with the file's value
    for section, values in raw.items():
        for key, value in values.items():
            got = getattr(getattr(cfg, section), key)
            if key == "functions":
                assert [dict(f) for f in got] == value
            elif isinstance(value, list):
                assert list(got) == value
            else:
                assert got == value, f"{section}.{key}"
    # keys the file does not set keep the schema defaults; interpolation follows run.name
    assert cfg.run.name == "grpo_arith_cpu"
    assert cfg.run.output_dir == "runs/grpo_arith_cpu"
    assert cfg.checkpoint.dir == "runs/grpo_arith_cpu/checkpoints"
    assert cfg.algo.clip_high == 0.28
    assert cfg.trainer.mini_batches == 1


def test_dotlist_overrides() -> None:
    cfg = _load("rollout.n=16", "algo.kl_coef=0.01", "run.name=abc", "algo.tis_cap=null")
    assert cfg.rollout.n == 16 and isinstance(cfg.rollout.n, int)
    assert cfg.algo.kl_coef == pytest.approx(0.01) and isinstance(cfg.algo.kl_coef, float)
    assert cfg.checkpoint.dir == "runs/abc/checkpoints"
    assert cfg.algo.tis_cap is None
    # checkpoints follow the run's output folder (a run elsewhere never resumes from runs/<name>'s checkpoints)
    assert _load("run.output_dir=/data/exp1").checkpoint.dir == "/data/exp1/checkpoints"
    assert _load("run.output_dir=/data/exp1", "checkpoint.dir=/ckpt").checkpoint.dir == "/ckpt"
    # overrides win over the file, the file over the defaults
    assert _load("trainer.lr=3e-6").trainer.lr == pytest.approx(3e-6)
    assert _load("rollout.n=8").rollout.n == 8


def test_reward_functions_override() -> None:
    cfg = _load("reward.functions=[{name: accuracy, weight: 1.0}, {name: boxed_format, weight: 0.5}]")
    assert [(f.name, f.weight) for f in cfg.reward.functions] == [("accuracy", 1.0), ("boxed_format", 0.5)]
    # an item that leaves out a field gets the schema default
    cfg = _load("reward.functions=[{name: boxed_format}]")
    assert cfg.reward.functions[0].weight == 1.0


@pytest.mark.parametrize("override, path", [
    ("rollout.nn=3", "rollout.nn"),
    ("nosuch=1", "nosuch"),
    ("trainer.optim.lr=1", "trainer.optim"),
])
def test_unknown_key_names_the_key_path(override: str, path: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(override)
    assert f"'{path}'" in str(e.value)
    assert "unknown config key" in str(e.value)


def test_unknown_key_in_the_yaml_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("rollout:\n  n: 4\n  temprature: 0.7\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout\.temprature'"):
        load_config(p)


@pytest.mark.parametrize("override, path", [
    ("rollout.n=abc", "rollout.n"),
    ("trainer.lr=fast", "trainer.lr"),
    ("data.arith_max=nine", "data.arith_max"),
])
def test_wrong_type_names_the_key(override: str, path: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(override)
    assert f"'{path}'" in str(e.value)
    assert "invalid value" in str(e.value)


def test_wrong_type_in_the_yaml_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("trainer:\n  total_steps: many\n")
    with pytest.raises(ConfigError, match=r"'trainer\.total_steps'"):
        load_config(p)


@pytest.mark.parametrize("key, bad", [
    ("algo.estimator", "ppo"),
    ("algo.loss_agg", "sum"),
    ("trainer.precision", "fp16"),
    ("algo.kl_estimator", "k4"),
    ("placement.strategy", "RANDOM"),
])
def test_bad_choice_lists_allowed_values(key: str, bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(f"{key}={bad}")
    msg = str(e.value)
    assert msg.startswith(f"{key}='{bad}'")
    for allowed in CHOICES[key]:
        assert repr(allowed) in msg


def test_allowed_values_are_the_documented_ones() -> None:
    assert CHOICES["algo.estimator"] == ("grpo", "rloo", "dr_grpo", "gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
    assert CHOICES["algo.loss_agg"] == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    assert CHOICES["trainer.precision"] == ("fp32", "bf16-autocast", "fp8")
    # every allowed value is accepted (by the planner: a run also checks this machine can run it, config/precision.py)
    resolved = {("placement.mode", "disaggregated_async"): "disaggregated"}  # deprecated: rollout.mode=one_step_off
    for key, allowed in CHOICES.items():
        for value in allowed:
            cfg = load_config(CPU_YAML, [f"{key}={value}"], plan_only=True)
            assert str(_get(cfg, key)) == resolved.get((key, value), value)


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("override, fragment", [
    ("trainer.lr=-1", "trainer.lr=-1.0 must be in (0, 1]"),
    ("trainer.lr=0", "trainer.lr=0.0 must be in (0, 1]"),
    ("rollout.n=1", "rollout.n=1 must be >= 2"),
    ("rollout.n=0", "rollout.n=0 must be >= 2"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5 must be in (0, 1]"),
    ("rollout.top_p=0", "rollout.top_p=0.0 must be in (0, 1]"),
    ("rollout.temperature=0", "rollout.temperature=0.0 must be > 0"),
    ("algo.kl_coef=-0.1", "algo.kl_coef=-0.1 must be a finite number >= 0"),
    ("trainer.min_lr_ratio=1.5", "trainer.min_lr_ratio=1.5 must be in [0, 1]"),
    ("algo.tis_cap=0.5", "algo.tis_cap=0.5 must be >= 1 or null"),
    ("trainer.betas=[0.9]", "trainer.betas=[0.9] must have 2 values"),
    ("reward.functions=[]", "reward.functions is empty"),
    ("metrics.prometheus_port=65536", "metrics.prometheus_port=65536 must be in [0, 65535]"),
    ("metrics.ray_export_port=70000", "metrics.ray_export_port=70000 must be in [0, 65535]"),
    ("metrics.ray_export_port=-1", "metrics.ray_export_port=-1 must be in [0, 65535]"),
])
def test_range_checks(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(override)
    assert fragment in str(e.value)


def test_mini_batches_must_divide_the_global_batch() -> None:
    # the CPU config has n=8, prompts_per_step=4: a global batch of 32
    with pytest.raises(ConfigError) as e:
        _load("trainer.mini_batches=3")
    assert "trainer.mini_batches=3 must divide the global batch" in str(e.value)
    assert "= 32" in str(e.value)
    with pytest.raises(ConfigError, match="= 30"):
        _load("rollout.n=6", "rollout.prompts_per_step=5", "trainer.mini_batches=4")
    assert _load("trainer.mini_batches=4").trainer.mini_batches == 4
    assert _load("rollout.n=6", "rollout.prompts_per_step=5", "trainer.mini_batches=3").trainer.mini_batches == 3


def test_reward_function_items_are_validated() -> None:
    with pytest.raises(ConfigError) as e:
        _load("reward.functions=[{name: accuracy, weight: 1.0}, {name: boxed_format, wieght: 0.5}]")
    msg = str(e.value)
    assert msg.startswith("reward.functions[1]:")
    assert "'wieght'" in msg and "unknown config key" in msg
    with pytest.raises(ConfigError) as e:
        _load("reward.functions=[{name: accuracy, weight: heavy}]")
    assert str(e.value).startswith("reward.functions[0]:")
    assert "'weight'" in str(e.value)


def test_result_is_read_only() -> None:
    cfg = _load()
    with pytest.raises(ReadonlyConfigError):
        cfg.rollout.n = 3
    with pytest.raises(ReadonlyConfigError):
        cfg.reward.functions[0].weight = 2.0
    with pytest.raises(ReadonlyConfigError):
        cfg.reward.functions.append({"name": "x", "weight": 1.0})
    assert cfg.rollout.n == 8
    assert len(cfg.reward.functions) == 1


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(missing)
    assert str(missing) in str(e.value)
    assert "does not exist" in str(e.value)


def test_override_without_equals_sign() -> None:
    with pytest.raises(ConfigError, match=r"'trainer\.lr' is not of the form key\.path=value"):
        _load("trainer.lr")


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("override, fragment", [
    ("algo.kl_coef=nan", "algo.kl_coef=nan must be a finite number"),
    ("trainer.grad_clip=nan", "trainer.grad_clip=nan must be a finite number"),
    ("trainer.warmup_steps=100", "trainer.warmup_steps=100 exceeds the run's optimizer steps"),
    ("rollout.max_model_len=10", "exceed rollout.max_model_len (10)"),
    ("rollout.gpu_memory_utilization=5", "rollout.gpu_memory_utilization=5.0 must be in (0, 1]"),
    ("placement.trainer_per_worker=-1", "placement.trainer_per_worker=-1.0 must be a finite number >= 0"),
    ("reward.functions=[{name: acuracy}]", "reward.functions[0].name"),
    ("reward.functions=[accuracy, accuracy]", "duplicate names"),
    ("data.arith_ops=[%]", "cannot parse the overrides"),
    ("=x", "not of the form key.path=value"),
    # found by a new user's try (2026-12-06): accepted before, failing later or silently wrong
    ("rollout.kv_cache_space_gib=-4", "rollout.kv_cache_space_gib=-4 must be > 0"),
    ("trainer.num_threads=-4", "trainer.num_threads=-4 must be >= 0"),
    ("reward.model_batch_size=0", "reward.model_batch_size=0 must be > 0"),
    ("algo.clip_low=1.5", "algo.clip_low=1.5 must be in [0, 1)"),
    ("guards.spike_min_steps=50", "guards.spike_min_steps=50 exceeds guards.spike_window=20"),
    # session 31: a lower-case GPU waited placement.timeout_s for a resource no node has
    ("placement.resource=gpu", "placement.resource='gpu': Ray's resource names are case-sensitive"),
    ("placement.resource=Fake_GPU", "use 'fake_gpu'"),
])
def test_more_bad_values_fail_before_any_work(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(CPU_YAML, [override])
    assert fragment in str(info.value)


def test_reward_function_given_by_name_only():
    cfg = load_config(CPU_YAML, ["reward.functions=[accuracy, boxed_format]"])
    assert [(f.name, f.weight) for f in cfg.reward.functions] == [("accuracy", 1.0), ("boxed_format", 1.0)]


def test_broken_yaml_file_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {n: 4\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("rollout:\n  n: 4\nrollout:\n  n: 5\n")  # the parser's finding and its line, not its first words
    with pytest.raises(ConfigError, match="found duplicate key rollout; line 3, column 1"):
        load_config(bad)


def test_holdout_is_a_fraction_or_a_whole_count():
    with pytest.raises(ConfigError, match=r"eval.holdout=1.5 is neither a fraction in \(0, 1\)"):
        load_config(CPU_YAML, ["eval.data=null", "eval.holdout=1.5"])
    assert load_config(CPU_YAML, ["eval.data=null", "eval.holdout=2"]).eval.holdout == 2


def test_validate_takes_a_loaded_config():
    validate(load_config(CPU_YAML, ["rollout.mode=stream", "algo.max_staleness=2"]))  # resolved: nothing to write


@pytest.mark.parametrize("key", ["reward.functions", "metrics.sinks", "env.name", "weight_sync.strategy"])
def test_a_user_module_that_raises_while_importing_is_a_config_error(tmp_path, monkeypatch, key):
    (tmp_path / "broken_user_mod.py").write_text('raise RuntimeError("boom")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    value = {"reward.functions": "[{name: 'broken_user_mod:f', weight: 1.0}]", "metrics.sinks": "[jsonl, 'broken_user_mod:S']",
             "env.name": "broken_user_mod:Env", "weight_sync.strategy": "broken_user_mod.x"}[key]
    if key == "weight_sync.strategy":  # a dotted module path: a package holding the module
        (tmp_path / "broken_user_pkg").mkdir()
        (tmp_path / "broken_user_pkg" / "__init__.py").write_text("")
        (tmp_path / "broken_user_pkg" / "x.py").write_text('raise RuntimeError("boom")\n')
        value = "broken_user_pkg.x"
    with pytest.raises(ConfigError, match=r"raised RuntimeError: boom"):
        load_config(CPU_YAML, [f"{key}={value}"])


def test_a_strategy_module_whose_strategy_is_not_one_is_refused(tmp_path, monkeypatch):
    (tmp_path / "odd_strategy_pkg").mkdir()
    (tmp_path / "odd_strategy_pkg" / "__init__.py").write_text("")
    (tmp_path / "odd_strategy_pkg" / "s.py").write_text("STRATEGY = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="STRATEGY = 42 is not a strategy"):
        load_config(CPU_YAML, ["weight_sync.strategy=odd_strategy_pkg.s"])


@pytest.mark.parametrize("override, section, first", [
    ("algo.dynamic_sampling=true", "algo.dynamic_sampling", "enabled"),
    ("algo.rollout_correction=token_mask", "algo.rollout_correction", "mode"),
    ("reward.overlong_penalty=true", "reward.overlong_penalty", "enabled"),
    ("weight_sync.disk=3", "weight_sync.disk", "path"),
])
def test_a_value_in_place_of_a_section_names_the_section_and_its_keys(override, section, first):
    with pytest.raises(ConfigError, match=rf"{section} is a section, not a value; set its keys, e.g. {section}.{first}="):
        load_config(CPU_YAML, [override])


@pytest.mark.parametrize("kwargs, message", [
    ("{wall_s: 0}", r"env.kwargs \(env.name='python'\): SandboxLimits.wall_s=0"),
    ("{max_tool_calls: -1}", r"env.kwargs.max_tool_calls=-1: need >= 0"),
    ("{reward_fn: nope}", r"unknown reward function 'nope'"),
    ("{no_such_kwarg: 1}", r"env.name='python': cannot build it with env.kwargs"),
])
def test_a_built_in_environment_is_built_at_load_so_bad_kwargs_fail_there(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CPU_YAML, ["env.name=python", f"env.kwargs={kwargs}", "env.kwargs.reward_fn=accuracy"]
                    if "reward_fn" not in kwargs else ["env.name=python", f"env.kwargs={kwargs}"])


def test_an_async_llm_engine_refuses_what_its_engine_core_cannot_run():
    """rollout.engine=async_llm: its engine core is a process of vLLM's, no Ray worker (actors/rollout/async_llm_engine.py)."""
    for strategy in ("disk", "object_store", "auto"):
        assert load_config(None, ["rollout.engine=async_llm", f"weight_sync.strategy={strategy}"]).rollout.engine == "async_llm"
    for strategy in ("nccl", "delta"):
        with pytest.raises(ConfigError, match=rf"rollout.engine=async_llm: weight_sync.strategy={strategy} .*'disk', 'object_store'.*OUTSIDE_RAY"):
            load_config(None, ["rollout.engine=async_llm", f"weight_sync.strategy={strategy}"])
    with pytest.raises(ConfigError, match="rollout.engine=async_llm: rollout.tensor_parallel_size=2"):
        load_config(None, ["rollout.engine=async_llm", "weight_sync.strategy=disk", "rollout.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="rollout.engine"):
        load_config(None, ["rollout.engine=async"])
    assert load_config(None, ["weight_sync.strategy=nccl"]).rollout.engine == "in_process"  # the default takes every one


def test_an_empty_or_mistyped_value_names_what_the_key_takes():
    """OmegaConf's own wording ("Incompatible value 'None' for field of type 'str'") said neither that the value was
    empty nor what the key takes."""
    with pytest.raises(ConfigError, match=r"'rollout.engine': it is empty \(null\).*choose one of \['in_process', 'async_llm'\]"):
        load_config(None, ["rollout.engine="])
    with pytest.raises(ConfigError, match=r"'rollout.temperature': it is empty \(null\).*\(the default: 1.0\)"):
        load_config(None, ["rollout.temperature="])
    with pytest.raises(ConfigError, match=r"'rollout.n': Value 'abc' .*Integer \(the default: 8\)"):
        load_config(None, ["rollout.n=abc"])
