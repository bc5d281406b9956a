"""WeightSyncer.sync_with_retries (weight_sync.retries): a sync that fails verification is redone and counted
in `sync/failures` (Prometheus rl_orch_sync_failures_total); a hung transport is not retried, nor are non-finite
trainer weights (reported as NaN, not as a mismatch)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.weight_sync import NonFiniteWeightsError, WeightMismatchError, check_finite_checksums
from orchestrator.weight_sync.syncer import WeightSyncer

CFG = load_config("configs/grpo_arith_cpu.yaml")


class _Flaky(WeightSyncer):
    """Fails its first `failures` syncs with `error`, then passes."""

    name = "flaky"

    def __init__(self, failures: int, error: Exception):
        super().__init__(CFG, trainer=None, engines=[])
        self.failures, self.error, self.calls = failures, error, []

    def sync(self, version, engine_ids=None):
        self.calls.append(version)
        if len(self.calls) <= self.failures:
            raise self.error
        return {"sync/version": version}


def test_a_failed_verification_is_redone_and_counted():
    s = _Flaky(1, WeightMismatchError("rollout worker 1: tensor group 'lm_head' differs"))
    assert s.sync_with_retries(7, retries=1) == {"sync/version": 7, "sync/failures": 1}
    assert s.calls == [7, 7]
    assert _Flaky(0, WeightMismatchError("x")).sync_with_retries(3, retries=1)["sync/failures"] == 0


def test_the_last_mismatch_is_raised_when_every_attempt_fails():
    s = _Flaky(3, WeightMismatchError("rollout worker 0: weight version 1, expected 2"))
    with pytest.raises(WeightMismatchError, match="rollout worker 0"):
        s.sync_with_retries(2, retries=2)
    assert s.calls == [2, 2, 2]
    with pytest.raises(WeightMismatchError):
        _Flaky(1, WeightMismatchError("x")).sync_with_retries(2, retries=0)


def test_a_timeout_is_not_retried():
    s = _Flaky(1, TimeoutError("weight sync (nccl): the broadcast did not finish within weight_sync.timeout_s=600s"))
    with pytest.raises(TimeoutError):
        s.sync_with_retries(2, retries=3)
    assert s.calls == [2]


def test_negative_retries_are_refused_at_config_load():
    with pytest.raises(ConfigError, match="weight_sync.retries=-1"):
        load_config("configs/grpo_arith_cpu.yaml", ["weight_sync.retries=-1"])


class _NaNTrainer(WeightSyncer):
    """A real `sync` whose transfer returns the trainer's checksums with a NaN group (no Ray)."""

    def __init__(self, engine_nan: bool = False):
        super().__init__(CFG, trainer=None, engines=[])
        self.transfers, self.engine_nan = 0, engine_nan
        self.strategy = SimpleNamespace(check_reports=lambda version, reports: None, metrics=lambda m, r: {})

    def _transfer(self, version, ids):
        self.transfers += 1
        good = {"model.embed_tokens": [1.5, 4.0, 8.0], "model.layers.0.self_attn": [0.5, 2.0, 16.0]}
        bad = {**good, "model.layers.0.self_attn": [math.nan, math.nan, 16.0]}
        trainer, engine = (good, bad) if self.engine_nan else (bad, bad)
        return {"groups": trainer, "bytes": 96}, {0: {"version": version, "groups": engine}}


def test_non_finite_trainer_weights_fail_at_once_as_nan_not_as_a_mismatch():
    s = _NaNTrainer()
    with pytest.raises(NonFiniteWeightsError) as e:
        s.sync_with_retries(4, retries=3)
    assert s.transfers == 1  # no retry: the trainer's own weights cannot match anything
    msg = str(e.value)
    assert "the trainer's weights are not finite: tensor group 'model.layers.0.self_attn' has sum nan" in msg
    assert "differs" not in msg and not isinstance(e.value, WeightMismatchError)


def test_an_engine_holding_nan_is_a_mismatch_named_as_nan_and_retried():
    s = _NaNTrainer(engine_nan=True)
    s.engines, s.engine_versions = [None], [None]
    with pytest.raises(WeightMismatchError, match="'model.layers.0.self_attn' holds non-finite weights"):
        s.sync_with_retries(4, retries=1)
    assert s.transfers == 2


def test_check_finite_checksums_names_the_first_group_in_model_order():
    check_finite_checksums({"a": [1.0, 1.0, 1.0]})
    with pytest.raises(NonFiniteWeightsError, match="tensor group 'b' has sum inf"):
        check_finite_checksums({"a": [1.0, 1.0, 1.0], "b": [math.inf, math.inf, 2.0], "c": [math.nan, 0.0, 1.0]})
