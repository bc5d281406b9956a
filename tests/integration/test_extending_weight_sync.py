"""The worked example of docs/extending_weight_sync.md: a new weight-sync strategy in one file
(docs/examples/weight_sync_example.py, "shared_file") plus its registry line, used for real syncs.

Importing the example registers it (inside the tests: the fixture takes it out of the registry again, so no
other test sees it); the config then accepts `weight_sync.strategy=shared_file`, and the
shared syncer drives it into two vLLM engines on the tiny model: every engine ends bit-exact with the
trainer across an optimizer step, verification passes (and catches a corrupted load), old versions go.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import ray

from orchestrator.config import ConfigError
from orchestrator.weight_sync import WeightMismatchError, predict_sync, setup_from_fabric, strategy_names
from orchestrator.weight_sync import registry
from orchestrator.weight_sync.syncer import make_syncer
from tests.integration.test_weight_sync import _assert_bit_exact, _cfg, _kill, _start, _sync_versions_bit_exact

pytestmark = pytest.mark.integration
EXAMPLE = "docs.examples.weight_sync_example"


@pytest.fixture(autouse=True)
def example_registered():
    """The example module, imported (its registry line runs); afterwards the registry is as before."""
    import importlib

    before = set(registry.strategy_names())
    module = importlib.import_module(EXAMPLE)
    registry.register("shared_file", EXAMPLE, module.PREDICT)  # its registry line (runs once per import)
    yield module
    for name in set(registry.strategy_names()) - before:
        registry.unregister(name)


def test_the_example_is_registered_with_its_predictor(tiny_model, tmp_path, example_registered):
    assert "shared_file" in strategy_names() and example_registered.ENTRY.load() is example_registered.STRATEGY
    assert "shared_file" in predict_sync(setup_from_fabric(1e9, 2, 1, 1, 0))
    with pytest.raises(ConfigError, match="weight_sync.strategy='carrier_pigeon'"):
        _cfg(tiny_model, tmp_path, "weight_sync.strategy=carrier_pigeon")


def test_the_example_by_dotted_path_needs_no_registry_line(tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "weight_sync.strategy=docs.examples.weight_sync_example")
    assert cfg.weight_sync.strategy in strategy_names()  # registered under its path on first use
    assert "docs.examples.weight_sync_example" in predict_sync(setup_from_fabric(1e9, 2, 1, 1, 0))  # its PREDICT
    with pytest.raises(ConfigError, match="weight_sync.strategy='docs.examples.my_env': the module defines no STRATEGY"):
        _cfg(tiny_model, tmp_path, "weight_sync.strategy=docs.examples.my_env")
    with pytest.raises(ConfigError, match="weight_sync.strategy='no_such_pkg.strategy': cannot import module 'no_such_pkg.strategy'"):
        _cfg(tiny_model, tmp_path, "weight_sync.strategy=no_such_pkg.strategy")


# One trainer and two engines serve both names: a syncer by the registered name, then one by the dotted path.
def test_example_strategy_syncs_verified_and_bit_exact(ray_local, tiny_model, tmp_path):
    trainer, engines = _start(_cfg(tiny_model, tmp_path, "weight_sync.strategy=shared_file"), tiny_model)
    try:
        for first, name in ((1, "shared_file"), (4, "docs.examples.weight_sync_example")):
            _check_syncs_verified_and_bit_exact(_cfg(tiny_model, tmp_path / name, f"weight_sync.strategy={name}"),
                                                trainer, engines, first)
    finally:
        _kill(trainer, *engines)


def _check_syncs_verified_and_bit_exact(cfg, trainer, engines, first: int) -> None:
    """Versions first, first + 1 (an optimizer step between them) bit-exact and verified; the older version's
    folder removed; a corrupted load at first + 2 caught."""
    syncer = make_syncer(cfg, trainer, engines)
    for metrics in _sync_versions_bit_exact(syncer, trainer, engines, (first, first + 1)):  # verified syncs
        assert metrics["sync/bytes"] == metrics["sync/bytes_full"] > 0
    left = sorted(p.name for p in (Path(cfg.weight_sync.disk.path) / "shared_file").iterdir())
    assert left == [f"v{first + 1}"], f"old versions or temporary folders left behind: {left}"
    ray.get(engines[1].extension_call.remote("inject_fault_next_load"))
    with pytest.raises(WeightMismatchError, match="rollout worker 1"):
        syncer.sync(first + 2)
