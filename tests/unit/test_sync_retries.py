"""WeightSyncer.sync_with_retries (weight_sync.retries): a sync that fails verification is redone and counted
in `sync/failures` (Prometheus rl_orch_sync_failures_total); a hung transport is not retried."""
from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.weight_sync import WeightMismatchError
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
