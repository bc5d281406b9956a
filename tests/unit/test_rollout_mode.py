"""rollout.mode (orchestrator/config/rollout_mode.py): resolved once at load from the new key or the deprecated ones
(placement.mode=disaggregated_async, rollout.partial_rollout), conflicts refused naming both keys."""
from __future__ import annotations

import warnings

import pytest
from omegaconf import OmegaConf

from orchestrator.config import ConfigError, load_config
from orchestrator.config.rollout_mode import resolve_rollout_mode, staleness_bound

YAML = "configs/grpo_arith_cpu.yaml"


def _load(*over: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(YAML, list(over))
    return cfg, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize("over, mode, placement", [
    ((), "sync", "disaggregated"),
    (("placement.mode=colocated",), "sync", "colocated"),
    (("rollout.mode=one_step_off",), "one_step_off", "disaggregated"),
    (("rollout.mode=stream", "algo.max_staleness=2"), "stream", "disaggregated"),
])
def test_the_new_keys_load_without_a_warning(over, mode, placement):
    cfg, said = _load(*over)
    assert (cfg.rollout.mode, cfg.placement.mode, said) == (mode, placement, [])
    assert cfg.rollout.partial_rollout is False  # the deprecated key is read into the mode
    assert staleness_bound(cfg) == (0 if mode == "sync" else cfg.algo.max_staleness)


@pytest.mark.parametrize("over, mode, old, new", [
    (("placement.mode=disaggregated_async",), "one_step_off", "placement.mode=disaggregated_async",
     "placement.mode=disaggregated rollout.mode=one_step_off"),
    (("placement.mode=disaggregated_async", "rollout.partial_rollout=true"), "stream",
     "placement.mode=disaggregated_async rollout.partial_rollout=true", "placement.mode=disaggregated rollout.mode=stream"),
    (("rollout.partial_rollout=true",), "stream", "rollout.partial_rollout=true", "rollout.mode=stream"),
    (("rollout.mode=stream", "rollout.partial_rollout=true"), "stream", "rollout.partial_rollout=true",
     "rollout.mode=stream"),
])
def test_the_deprecated_keys_still_load_and_name_the_new_ones(over, mode, old, new, tmp_path):
    cfg, said = _load(*over)
    assert (cfg.rollout.mode, cfg.placement.mode) == (mode, "disaggregated")
    assert said == [f"config: {old} is deprecated; write {new} (docs/configuration.md, rollout.mode)"]
    # what the run folder's config.yaml holds loads again with the new keys and says nothing
    saved = tmp_path / "config.yaml"
    OmegaConf.save(cfg, saved)
    again, said = _load_file(saved)
    assert (again.rollout.mode, again.placement.mode, said) == (mode, "disaggregated", [])


def _load_file(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(str(path))
    return cfg, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize("over, both", [
    (("rollout.mode=sync", "placement.mode=disaggregated_async"), ("placement.mode", "rollout.mode=sync")),
    (("rollout.mode=one_step_off", "rollout.partial_rollout=true"), ("rollout.partial_rollout", "rollout.mode")),
    (("rollout.mode=one_step_off", "placement.mode=colocated"), ("rollout.mode=one_step_off", "placement.mode")),
    (("rollout.mode=stream", "placement.mode=colocated"), ("rollout.mode=stream", "placement.mode")),
    (("rollout.partial_rollout=true", "placement.mode=colocated"), ("rollout.partial_rollout", "placement.mode")),
    (("rollout.mode=stream", "algo.max_staleness=0"), ("rollout.mode=stream", "algo.max_staleness", "got 0")),
    (("rollout.mode=stream", "algo.max_staleness=-1"), ("algo.max_staleness=-1", ">= 0")),
    (("rollout.mode=SYNC", "placement.mode=colocated"), ("rollout.mode='SYNC' is not allowed", "'one_step_off'")),
    (("rollout.mode=async", "rollout.partial_rollout=true"), ("rollout.mode='async' is not allowed",)),
    (("rollout.mode=stream", "algo.tis_cap=null"), ("algo.tis_cap", "algo.old_logprobs=rollout")),
])
def test_conflicts_are_refused_naming_both_keys(over, both):
    with pytest.raises(ConfigError) as e:
        load_config(YAML, list(over))
    assert all(key in str(e.value) for key in both), str(e.value)


def test_a_saved_streaming_config_takes_any_mode_override(tmp_path):
    """The run folder's config.yaml of a stream run (written from the loaded config) reloads in another mode."""
    cfg, _ = _load("rollout.mode=stream")
    saved = tmp_path / "config.yaml"
    OmegaConf.save(cfg, saved)
    for mode in ("sync", "one_step_off"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = load_config(str(saved), [f"rollout.mode={mode}"])
        assert again.rollout.mode == mode and not [w for w in caught if issubclass(w.category, FutureWarning)]


def test_the_stream_refusal_offers_no_fix_it_refuses():
    with pytest.raises(ConfigError) as e:
        load_config(YAML, ["rollout.mode=stream", "algo.tis_cap=null"])
    assert "algo.max_staleness=0" not in str(e.value)


def test_resolving_twice_changes_nothing():
    cfg, _ = _load("placement.mode=disaggregated_async", "rollout.partial_rollout=true")
    copy = OmegaConf.create(OmegaConf.to_container(cfg))
    assert resolve_rollout_mode(copy) is None and copy == cfg
