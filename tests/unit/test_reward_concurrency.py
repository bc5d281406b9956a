"""Concurrent reward calls (actors/reward.py): the reward actor runs reward.num_workers `score` calls at once
unless a reward model is loaded in it, and `RewardScorer.score` is safe to call from several threads.

Run: .venv/bin/python -m pytest tests/unit/test_reward_concurrency.py -q
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

import actors.reward as reward_actor
from actors.reward import reward_concurrency, start_reward_actor
from orchestrator.reward import RewardScorer

SLEEP = "tests.unit.reward_helpers:sleep_one_second"


def test_concurrency_rule():
    assert reward_concurrency(4, has_model=False) == 4
    assert reward_concurrency(4, has_model=True) == 1
    with pytest.raises(ValueError, match="num_workers"):
        reward_concurrency(0, has_model=False)


class _FakeActorClass:
    """Records `.options(**kw).remote(*args, **kwargs)` as Ray's actor class would receive them."""

    def __init__(self):
        self.options_kw, self.args, self.kwargs = None, None, None

    def options(self, **kw):
        self.options_kw = kw
        return self

    def remote(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        return "handle"


def _reward_cfg(model_path=None) -> SimpleNamespace:
    return SimpleNamespace(functions=[SimpleNamespace(name="accuracy", weight=1.0)], timeout_s=5.0, num_workers=3,
                           memory_limit_mb=512, model_path=model_path, model_weight=0.5, model_batch_size=4)


def test_a_closed_scorer_refuses_calls():
    scorer = RewardScorer([("accuracy", 1.0)], num_workers=1)
    scorer.close()
    scorer.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        scorer.score(["4"], ["4"], [0])


@pytest.mark.parametrize("model_path, expected", [(None, 3), ("/models/rm", 1)])
def test_start_reward_actor_sets_max_concurrency(monkeypatch, model_path, expected):
    fake = _FakeActorClass()
    monkeypatch.setattr(reward_actor, "RewardActor", fake)
    assert start_reward_actor(_reward_cfg(model_path), {"num_cpus": 1}) == "handle"
    assert fake.options_kw == {"num_cpus": 1, "max_concurrency": expected}
    assert fake.args == ([("accuracy", 1.0)], 5.0, 3)
    rm = {"path": model_path, "weight": 0.5, "batch_size": 4} if model_path else None
    assert fake.kwargs == {"reward_model": rm, "memory_limit_mb": 512}


def test_scorer_calls_from_two_threads_overlap():
    with RewardScorer([(SLEEP, 1.0)], timeout_s=10.0, num_workers=2) as scorer:
        with ThreadPoolExecutor(2) as pool:  # two first calls at once: the pool starts once (on its first schedule)
            warm = list(pool.map(lambda c: scorer.score([c], [""], [0]), ["warm", "up"]))
        assert [r.rewards for r in warm] == [[4.0], [2.0]]
        batches = [(["a", "bb"], ["", ""], [0, 0]), (["ccc"], [""], [7])]
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda b: scorer.score(*b), batches))
        elapsed = time.perf_counter() - start
    assert elapsed < 1.8, f"two 1 s reward calls took {elapsed:.2f} s: they did not overlap"
    assert [r.rewards for r in results] == [[1.0, 2.0], [3.0]]
    assert [r.failures.calls for r in results] == [1, 1]
    assert all(r.failures.failed == 0 for r in results)
