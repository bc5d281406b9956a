"""Per-group scoring of fully asynchronous training (orchestrator/rollout/group_scores.py, stream_source.py) and the
wait that drains the engines while the trainer trains (orchestrator/runtime/overlap.py, `Job.wait(refs, pump)`), with fakes:
per-group reward results merged equal one call on the batch (metrics too), each group is scored once as it
completes (also while the trainer trains), dropped groups are forgotten, and a hung trainer still times out.

    .venv/bin/python -m pytest tests/unit/test_group_scores.py -q
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import ray

import orchestrator.job as job_module
from orchestrator.job import Job
from orchestrator.runtime.overlap import pump_until
from orchestrator.reward.failures import FailureTally
from orchestrator.reward.scorer import RewardResult, RewardScorer, merge_results
from orchestrator.rollout.group_scores import GroupScores
from orchestrator.rollout.types import Trajectory
from tests.unit.test_stream_source import _DeadWorker, _FakeWorker, _Lost, _setup

HELPERS = "tests.unit.reward_helpers"


# ---- merge_results ------------------------------------------------------------------------------------------
def test_merged_group_results_equal_one_call_on_the_batch_metrics_and_failures_too():
    texts = ["BOOM", "\\boxed{4}", "5", "BOOM", "\\boxed{7}", "7", "BOOM", "\\boxed{1}"]
    answers = ["4", "4", "5", "5", "7", "7", "1", "1"]
    groups = [10, 10, 11, 11, 12, 12, 13, 13]  # groups 10 and 13 start with "BOOM": raise_on_marker fails on them
    functions = [("accuracy", 1.0), ("boxed_format", 0.1), (f"{HELPERS}:raise_on_marker", 0.5)]
    with RewardScorer(functions, timeout_s=5.0, num_workers=2) as scorer:
        whole = scorer.score(texts, answers, groups)
        parts = [scorer.score(texts[i:i + 2], answers[i:i + 2], groups[i:i + 2]) for i in range(0, 8, 2)]
    merged = merge_results(parts)
    assert merged.rewards == whole.rewards and merged.per_function == whole.per_function
    assert merged.failures == whole.failures and whole.failures.failed == 2 and whole.failures.calls == 12
    assert merged.metrics.keys() == whole.metrics.keys()
    for key, value in whole.metrics.items():
        if key != "reward/score_s":  # seconds: the parts' sum (the reward actor's busy time), not one call's wall
            assert merged.metrics[key] == pytest.approx(value, abs=1e-12), key
    assert merged.metrics["reward/score_s"] == pytest.approx(sum(p.metrics["reward/score_s"] for p in parts))
    assert merged.metrics["reward/failed_frac"] == pytest.approx(2 / 12)


def _result(rewards, model, calls=1, failed=()):
    tally = FailureTally(calls=calls)
    for name, kind in failed:
        tally.add(name, kind)
    return RewardResult(rewards, {"f": list(rewards), "reward_model": list(model)},
                        {"reward/f_mean": sum(rewards) / len(rewards), "reward/model_mean": sum(model) / len(model),
                         "reward/mean": sum(rewards) / len(rewards), "reward/score_s": 0.5}, tally)


def test_merge_weights_other_means_by_samples_and_checks_its_input():
    merged = merge_results([_result([1.0], [4.0], failed=[("f", "timeout")]), _result([0.0, 0.0, 3.0], [0.0, 0.0, 0.0])])
    assert merged.metrics["reward/model_mean"] == pytest.approx(1.0)  # (4 + 0 + 0 + 0) / 4 samples, not (4 + 0) / 2
    assert merged.metrics["reward/f_mean"] == merged.metrics["reward/mean"] == pytest.approx(1.0)
    assert merged.metrics["reward/timeouts"] == 1.0 and merged.metrics["reward/failed_frac"] == 0.5
    assert merged.metrics["reward/score_s"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least one"):
        merge_results([])
    other = RewardResult([1.0], {"g": [1.0]})
    with pytest.raises(ValueError, match="different reward functions"):
        merge_results([_result([1.0], [1.0]), other])


# ---- GroupScores ----------------------------------------------------------------------------------------------
def _traj(gid: int, i: int) -> Trajectory:
    return Trajectory(group_id=gid, prompt_ids=[1], response_ids=[2] * (i + 1), logprobs=[-0.1] * (i + 1),
                      finish_reason="stop", text=f"{gid}.{i}")


def _fake_issue(issued: list):
    """A reward 'ref' (the RewardResult itself) and a reference 'ref' (the logprobs) per group; the ids recorded."""
    def issue(trajs):
        issued.append(trajs[0].group_id)
        rewards = [float(t.group_id) for t in trajs]
        return (RewardResult(rewards, {"f": rewards}, {"reward/f_mean": rewards[0], "reward/mean": rewards[0]},
                             FailureTally(calls=1)), [[-float(t.group_id)] * len(t.response_ids) for t in trajs])
    return issue


def test_group_scores_collect_in_batch_order_forget_dropped_and_name_missing_groups():
    issued, waits = [], []
    scores = GroupScores(_fake_issue(issued), lambda refs: waits.append(len(refs)) or refs)
    for gid in (3, 1, 2):
        scores.issue(gid, [_traj(gid, 0), _traj(gid, 1)])
    scores.issue(4, [])  # a group without trajectories (every episode failed to start): nothing to call
    with pytest.raises(ValueError, match="already being scored"):
        scores.issue(3, [_traj(3, 0)])
    scores.retain([1, 2, 4])  # 3 was dropped over the staleness bound
    assert 3 not in scores and issued == [3, 1, 2]
    row = {}
    batch = scores.collect(scores.pop([2, 4, 1]), row)
    assert batch.reward.rewards == [2.0, 2.0, 1.0, 1.0] and batch.reward.metrics["reward/mean"] == 1.5
    assert batch.reference == [[-2.0], [-2.0, -2.0], [-1.0], [-1.0, -1.0]]
    assert waits == [4] and row["stream/score_wait_s"] >= 0.0 and 1 not in scores
    with pytest.raises(ValueError, match=r"groups \[1\] were taken without being scored"):
        scores.pop([1])


# ---- StreamRollouts: scored as groups complete, and while the trainer trains ---------------------------------
def _stream(issued: list, workers=2, k=2, recover=None):
    """Streaming rollouts over fake workers (tests/unit/test_stream_source.py) whose groups are scored by `_fake_issue`."""
    rollouts, fakes, engine, _, _ = _setup(k, workers, recover=recover, score_group=_fake_issue(issued))
    return rollouts, fakes, engine


def _job(timeout_s: float) -> Job:
    return Job(SimpleNamespace(run=SimpleNamespace(phase_timeout_s=timeout_s, max_restarts=0)), "model", 0)


def test_groups_are_scored_as_they_complete_and_while_the_trainer_trains(monkeypatch):
    issued: list = []
    rollouts, fakes, engine = _stream(issued)
    rollouts.launch(1)
    row = {}
    trajs = rollouts.take(1, 0, row)  # batch 1 complete and scored; batches 2, 3 start now (k = 2)
    assert sorted(issued) == [2, 3] and sum(len(f.samples) for f in fakes) == 8
    scored = rollouts.scores(row)
    assert scored.reward.rewards == [float(t.group_id) for t in trajs] and "stream/score_wait_s" in row
    assert scored.reference == [[-float(t.group_id)] * len(t.response_ids) for t in trajs]
    assert rollouts.scores({}) is None  # each batch's scores are read once

    ready = iter([False, False, True])  # the trainer's ref: ready at the third wait
    monkeypatch.setattr(job_module, "refs_ready", lambda refs, wait_s: next(ready))
    monkeypatch.setattr(job_module.ray, "get", lambda refs, timeout: {"actor/loss": 0.0})
    assert _job(30.0).wait("train-ref", pump=rollouts.pump) == {"actor/loss": 0.0}
    assert sorted(issued) == [2, 3, 4, 5, 6, 7]  # the groups completed while training: scored before taken
    assert sum(len(f.samples) for f in fakes) == 0 and rollouts.engines.outstanding == [0, 0]
    finished = {}
    rollouts.finish_in_flight(finished)  # take's drain and two pumps, 0.1 s each per worker: counted once
    assert finished["rollout/worker_generate_s_mean"] == pytest.approx(0.3)
    assert finished["rollout/worker_held_s_mean"] == pytest.approx(0.15)  # 0.05 s held per drain, likewise
    engine.version = 1
    rollouts.synced(1)
    rollouts.launch(2)
    trajs = rollouts.take(2, 1, {})
    taken = {t.group_id for t in trajs}  # the first two of 4..7 to complete (completion order)
    assert len(taken) == 2 and taken <= {4, 5, 6, 7} and sorted(issued) == list(range(2, 8))  # each scored once
    assert rollouts.scores({}).reward.rewards == [float(t.group_id) for t in trajs]
    # a batch was ready: taken without a call to the workers (a weight load queued there does not hold the step);
    # groups 8, 9 (launched by launch(2)) are drained and scored by the next poll
    assert set(rollouts.group_scores.groups) == {4, 5, 6, 7} - taken
    rollouts.pump()
    assert sorted(issued) == list(range(2, 10)) and set(rollouts.group_scores.groups) == ({4, 5, 6, 7} - taken) | {8, 9}


def test_a_dropped_group_is_forgotten_and_discard_forgets_every_group():
    issued: list = []
    rollouts, _, engine = _stream(issued, workers=1, k=1)
    rollouts.taken = True  # batches 1 and 2 start together, at version 0
    rollouts.launch(1)
    rollouts.take(1, 0, {})
    engine.version = 5
    trajs = rollouts.take(4, 3, {})  # batch 2 (version 0) is 3 > k behind: dropped, batch 3 trained
    assert {t.group_id for t in trajs} == {6, 7} and 4 not in rollouts.group_scores
    assert rollouts.scores({}).reward.rewards == [6.0, 6.0, 7.0, 7.0]
    assert rollouts.group_scores.groups  # the complete groups not taken yet
    rollouts.discard()
    assert not rollouts.group_scores.groups and rollouts.scores({}) is None


def test_a_worker_lost_while_the_trainer_trains_is_replaced_after_the_train_step():
    replaced = []

    def recover(w, error):
        assert isinstance(error, _Lost)
        replaced.append(w)
        return _FakeWorker(engine)

    issued: list = []
    rollouts, fakes, engine = _stream(issued, recover=recover)
    rollouts.launch(1)
    rollouts.take(1, 0, {})
    rollouts.engines.handles[0] = rollouts.engines.sent_to[0] = _DeadWorker()
    rollouts.pump()  # no replacement now (it would sync from the busy trainer); worker 1 is still drained
    rollouts.pump()  # skipped after a failure, until the next take
    assert replaced == [] and rollouts.engines.failed and fakes[1].samples == []
    rollouts.synced(1)
    row = {}
    rollouts.take(2, 1, row)  # the next poll replaces it and its groups start again there
    assert replaced == [0] and not rollouts.engines.failed and row["rollout/worker_restarts"] == 1.0
    assert row["rollout/groups_reissued"] >= 1


# ---- the overlap loop: pump_until, Job.wait(refs, pump) ---------------------------------------------------------
def test_pump_until_pumps_between_waits_and_returns_the_time_left():
    waits, pumps = [], []
    ready = iter([False, False, True])
    left = pump_until(lambda w: waits.append(w) or next(ready), lambda: pumps.append(1), 10.0, wait_s=0.05)
    assert pumps == [1, 1] and waits == [0.05] * 3 and 9.0 < left <= 10.0
    assert pump_until(lambda w: False, lambda: None, 0.0) == 0.0
    with pytest.raises(ValueError, match="wait_s"):
        pump_until(lambda w: True, lambda: None, 1.0, wait_s=0.0)


def test_a_hung_trainer_still_times_out_while_the_engines_are_drained(monkeypatch):
    pumps, timeouts = [], []

    def get(refs, timeout):
        timeouts.append(timeout)
        raise ray.exceptions.GetTimeoutError("not ready")

    monkeypatch.setattr(job_module, "refs_ready", lambda refs, wait_s: time.sleep(wait_s) or False)
    monkeypatch.setattr(job_module.ray, "get", get)
    with pytest.raises(TimeoutError, match="run.phase_timeout_s=0.3"):
        _job(0.3).wait("train-ref", pump=lambda: pumps.append(1))
    assert pumps and timeouts == [0.0]  # the pumps used the whole timeout: the bounded get does not wait again
