"""The rollout-mode seam's worked example (docs/examples/rollout_mode_example.py, `overfit_one_batch`), named by its
dotted path as a user would: the config loads with it and keeps sync's contract, the one factory builds its pipeline,
and over a simulated rollout source every step trains the same prompts under the step's own group ids while the
prompt loader never moves (so a resume draws them again). The registry refuses what is not a mode."""
from __future__ import annotations

import sys
import types

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.config.rollout_mode import mode_kind, staleness_bound
from orchestrator.rollout import modes
from orchestrator.rollout.pipeline import rollout_pipeline
from tests.unit.test_async_rollouts import FakeController, FakeSource

EXAMPLE = "docs.examples.rollout_mode_example"
YAML = "configs/grpo_arith_cpu.yaml"


def test_the_example_loads_by_its_dotted_path_and_keeps_the_sync_contract():
    cfg = load_config(YAML, [f"rollout.mode={EXAMPLE}", "placement.mode=colocated", "algo.max_staleness=3"])
    assert cfg.rollout.mode == EXAMPLE and mode_kind(cfg) == "sync" and staleness_bound(cfg) == 0
    assert EXAMPLE in modes.mode_names() and modes.get(EXAMPLE).kind == modes.SYNC


def test_every_step_trains_the_first_batch_and_the_loader_never_moves():
    ctl = FakeController(total=3)
    ctl.cfg.rollout = {"mode": EXAMPLE}
    pipeline = rollout_pipeline(FakeSource(ctl), ctl.sample_prompts, ctl.loader, ctl.cfg, ctl.start_step)
    start, prompts = ctl.loader.state_dict(), []
    for step in (1, 2, 3):
        pipeline.launch(step)
        trajs = pipeline.take(step, ctl.version, {})
        assert [t.group_id for t in trajs] == [2 * step, 2 * step + 1]  # the step's ids: its own seeds
        prompts.append([t.prompt_ids for t in trajs])
        pipeline.finish_in_flight({})
        ctl.sync(step)
        pipeline.synced(step)
        assert ctl.loader.state_dict() == start and pipeline.state_dict() is None  # what a checkpoint keeps
    assert prompts[0] == prompts[1] == prompts[2]


def test_what_is_not_a_mode_is_refused_naming_rollout_mode(monkeypatch):
    with pytest.raises(ConfigError, match="rollout.mode='tests.unit.no_such_module': cannot import module 'tests.unit.no_such_module'"):
        load_config(YAML, ["rollout.mode=tests.unit.no_such_module"])
    monkeypatch.setitem(sys.modules, "fake_pkg", types.ModuleType("fake_pkg"))
    monkeypatch.setitem(sys.modules, "fake_pkg.no_mode", types.ModuleType("fake_pkg.no_mode"))
    with pytest.raises(ConfigError, match="rollout.mode='fake_pkg.no_mode': the module defines no MODE"):
        load_config(YAML, ["rollout.mode=fake_pkg.no_mode"])
    with pytest.raises(ValueError, match="kind='eager' must be one of"):
        modes.RolloutMode("eager", "x:y", "eager")
    bad = {"fake_pkg.wrong_type": "sync", "fake_pkg.no_builder": modes.RolloutMode("m", "fake_pkg.no_mode:nope", "sync")}
    for path, value in bad.items():
        module = types.ModuleType(path)
        module.MODE = value
        monkeypatch.setitem(sys.modules, path, module)
    with pytest.raises(ConfigError, match=r"rollout.mode='fake_pkg.wrong_type': the module defines MODE = 'sync', not a"):
        load_config(YAML, ["rollout.mode=fake_pkg.wrong_type"])
    with pytest.raises(ConfigError, match=r"rollout.mode='fake_pkg.no_builder': its MODE.builder='fake_pkg.no_mode:nope' "
                                          "is not a callable"):
        load_config(YAML, ["rollout.mode=fake_pkg.no_builder"])
    with pytest.raises(ConfigError, match=r"choose one of \['sync', 'one_step_off', 'stream'\], or"):  # built-ins only
        load_config(YAML, ["rollout.mode=nope"])
