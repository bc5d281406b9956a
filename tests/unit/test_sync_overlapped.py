"""Overlapped weight syncs (weight_sync.overlap, orchestrator/weight_sync/overlapped.py): each engine is verified on
its own and released only when verified; a failed one stays held (its version forgotten, so the next sync sends it
full weights), more than weight_sync.retries failures of one engine in a row stop the run, a lost one is reported
by the next start (nothing started), and a replaced one is forgotten. WeightSyncer.finish_each over fake engines
(no Ray); OverlappedSyncs over a fake syncer.

    .venv/bin/python -m pytest tests/unit/test_sync_overlapped.py -q
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.config import load_config
from orchestrator.runtime.faults import EnginesLost
from orchestrator.weight_sync import WeightMismatchError
from orchestrator.weight_sync.overlapped import OverlappedSyncs
from orchestrator.weight_sync.probe import ProbeScores
from orchestrator.weight_sync.syncer import PendingSync, WeightSyncer

CFG = load_config("configs/grpo_arith_cpu.yaml")
GROUPS = {"model.embed_tokens": [1.5, 4.0, 8.0], "lm_head": [0.5, 2.0, 16.0]}


class _Engine:
    """Records `stream_release.remote()` calls."""

    def __init__(self):
        self.released = 0
        self.stream_release = SimpleNamespace(remote=self._release)

    def _release(self):
        self.released += 1


class _Syncer(WeightSyncer):
    """finish_each over given results: `reports` {engine: checksum report}, `probes` {engine: ProbeScores}, `lost`
    {engine: why} (its calls failed as a dead actor's), the trainer's probe scores `want`."""

    def __init__(self, reports, probes=None, lost=None, want=None):
        super().__init__(CFG, trainer=None, engines=[_Engine() for _ in range(3)])
        self.strategy = SimpleNamespace(check_reports=lambda v, r: None, metrics=lambda m, r: {})
        self.results, self.lost_engines, self.want = reports, lost or {}, want
        self.probe_results = probes or {}

    def _collect(self, refs, lost):
        lost.update({i: why for i, why in self.lost_engines.items() if i in refs})
        table = self.probe_results if refs and all(r == "probe" for r in refs.values()) else self.results
        return {i: table[i] for i in refs if i not in lost}

    def _get(self, refs, what):
        return self.want


def _pending(version=3, probed=False):
    ids = range(3)
    return PendingSync(version, 0.0, 0.25, {"groups": GROUPS, "bytes": 96}, {i: "load" for i in ids},
                       "trainer-probe" if probed else None, {i: "probe" for i in ids} if probed else {})


def test_each_engine_is_verified_on_its_own_and_only_the_verified_are_released():
    bad = {**GROUPS, "lm_head": [0.5, 2.0, 17.0]}
    s = _Syncer({0: {"version": 3, "groups": GROUPS}, 1: {"version": 3, "groups": bad},
                 2: {"version": 2, "groups": GROUPS}})
    metrics, failed, lost = s.finish_each(_pending())
    assert sorted(failed) == [1, 2] and lost == {}
    assert "lm_head" in failed[1] and "reports weight version 2, expected 3" in failed[2]
    assert [e.released for e in s.engines] == [1, 0, 0]  # the failed ones stay held
    assert s.engine_versions == [3, None, None]  # the next sync sends them full weights and probes them
    assert s.syncs == 0 and s.cleanup_due is None  # a sync that did not pass everywhere does not count
    assert metrics["sync/version"] == 3 and metrics["sync/overlapped"] == 1.0 and metrics["sync/blocking_s"] == 0.25


def test_a_probe_mismatch_fails_that_engine_and_a_lost_engine_is_reported():
    want = ProbeScores([-1.0, -2.0, -0.5])
    s = _Syncer({i: {"version": 3, "groups": GROUPS} for i in range(3)},
                probes={0: want, 1: ProbeScores([-1.0, -2.5, -0.5])}, lost={2: "the actor died"}, want=want)
    metrics, failed, lost = s.finish_each(_pending(probed=True))
    assert list(failed) == [1] and "probe logprobs differ" in failed[1] and lost == {2: "the actor died"}
    assert [e.released for e in s.engines] == [1, 0, 0]
    assert s.engine_versions == [3, None, None] and metrics["sync/probe_max_abs_diff"] == 0.0


def test_a_sync_verified_everywhere_counts_and_leaves_its_clean_up_to_the_next_start():
    s = _Syncer({i: {"version": 5, "groups": GROUPS} for i in range(3)})
    metrics, failed, lost = s.finish_each(_pending(version=5))
    assert failed == {} and lost == {} and [e.released for e in s.engines] == [1, 1, 1]
    assert s.engine_versions == [5, 5, 5] and s.syncs == 1 and s.cleanup_due == 5


class _FakeSyncer:
    """start/ready/finish_each of a WeightSyncer: `outcomes` is a list of (failed, lost) per sync, in order."""

    def __init__(self, outcomes, engines=2):
        self.outcomes, self.engines, self.started = list(outcomes), engines, []

    def start(self, version):
        self.started.append(version)
        return PendingSync(version, 0.0, 0.1, {"groups": {}, "bytes": 8}, {i: "load" for i in range(self.engines)})

    def ready(self, pending):
        return True

    def finish_each(self, pending):
        failed, lost = self.outcomes.pop(0)
        return {"sync/version": pending.version}, dict(failed), dict(lost)


def test_start_settles_the_previous_sync_and_returns_its_metrics_with_the_send_time():
    syncs = OverlappedSyncs(_FakeSyncer([({}, {}), ({}, {})]), retries=1)
    assert syncs.start(1) == {"sync/version": 1, "sync/send_s": 0.1}
    syncs.pump()  # every call returned: verified now, its metrics kept for the next start
    assert syncs.pending is None
    assert syncs.start(2) == {"sync/verified_version": 1, "sync/failures": 0, "sync/version": 2, "sync/send_s": 0.1}
    assert syncs.settle() == {"sync/version": 2, "sync/failures": 0} and syncs.settle() == {}


def test_a_sync_settled_for_eval_hands_its_metrics_to_the_next_start():
    syncs = OverlappedSyncs(_FakeSyncer([({}, {}), ({}, {})]), retries=1)
    syncs.start(1)
    assert syncs.settle(keep=True) == {} and syncs.pending is None  # verified now (eval uses the engines next)
    assert syncs.settle(keep=True) == {}  # nothing in flight: still kept
    assert syncs.start(2) == {"sync/verified_version": 1, "sync/failures": 0, "sync/version": 2, "sync/send_s": 0.1}


def test_one_engine_failing_more_than_retries_times_in_a_row_stops_the_run():
    fail = ({1: "rollout worker 1: tensor group 'lm_head' differs"}, {})
    syncs = OverlappedSyncs(_FakeSyncer([fail, ({}, {}), fail, fail]), retries=1)
    syncs.start(1)
    assert syncs.start(2)["sync/failures"] == 1  # one failure: held, resent full by sync 2
    syncs.start(3)  # sync 2 verified everywhere: the strike count starts again
    syncs.start(4)  # sync 3 failed: one strike
    with pytest.raises(WeightMismatchError, match="'lm_head' differs.*2 overlapped syncs in a row.*retries=1"):
        syncs.settle()  # sync 4 failed again: two in a row > retries


def test_a_lost_engine_is_raised_by_the_next_start_before_anything_starts_and_a_replaced_one_is_forgotten():
    fake = _FakeSyncer([({}, {0: "its weight load did not answer"}), ({}, {})])
    syncs = OverlappedSyncs(fake, retries=1)
    syncs.start(1)
    with pytest.raises(EnginesLost) as e:
        syncs.start(2)
    assert e.value.engines == [0] and fake.started == [1]  # sync 2 not started: the job replaces engine 0 first
    assert syncs.start(2) == {"sync/version": 2, "sync/send_s": 0.1} and fake.started == [1, 2]
    syncs.forget(1)  # engine 1 replaced meanwhile: its calls of sync 2 no longer count
    assert list(syncs.pending.loads) == [0]


def test_start_holds_each_engine_after_the_trainers_send_and_before_its_load():
    """The engines sample on their verified weights while the trainer sends (the hold used to come first: about
    the send's seconds of generation lost per sync); each is held before its load, in call order on the engine,
    so nothing is sampled on unverified weights."""
    log: list = []

    def call(name, result=None):
        return SimpleNamespace(remote=lambda *a: log.append(name) or result)

    send = SimpleNamespace(remote=lambda *a: log.append("trainer send") or ("payload", "meta-ref"))
    trainer = SimpleNamespace(weight_sync=SimpleNamespace(options=lambda **kw: send),
                              probe_logprobs=call("trainer probe", "want"))
    engines = [SimpleNamespace(stream_hold=call(f"hold {i}"), weight_sync=call(f"load {i}", f"load-ref {i}"),
                               probe_logprobs=call(f"probe {i}", f"probe-ref {i}")) for i in range(2)]
    s = WeightSyncer(CFG, trainer=trainer, engines=engines)
    s.strategy = SimpleNamespace(concurrent=False)  # what `setup` loads
    s._get = lambda ref, what: log.append(f"wait for {what}") or {"groups": GROUPS, "bytes": 96}
    pending = s.start(1)
    assert log.index("trainer send") < log.index("wait for the trainer's send") < log.index("hold 0")
    for i in range(2):
        assert log.index(f"hold {i}") < log.index(f"load {i}")
    assert pending.loads == {0: "load-ref 0", 1: "load-ref 1"} and pending.version == 1
