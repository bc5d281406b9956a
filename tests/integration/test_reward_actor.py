"""Integration tests of RewardActor on a local Ray cluster (CPU): case C06 inside a Ray actor.

Run: .venv/bin/python -m pytest tests/integration/test_reward_actor.py -q
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import ray

from actors.reward import RewardActor
from orchestrator.reward import RewardResult

HANG = "tests.unit.reward_helpers:hang_on_marker"


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def test_c06a_boxed_scores_one_in_actor(ray_local: None) -> None:
    actor = RewardActor.remote([("accuracy", 1.0), ("boxed_format", 0.5)], timeout_s=5.0)
    ref = actor.score.remote(["so \\boxed{4}", "it is 5"], ["4", "4"], [0, 0])
    result = ray.get(ref, timeout=120)
    assert isinstance(result, RewardResult)
    assert result.per_function["accuracy"] == [1.0, 0.0]
    assert result.rewards == pytest.approx([1.5, 0.0], abs=1e-5)
    ray.get(actor.close.remote(), timeout=60)


def test_c06b_timeout_inside_actor(ray_local: None) -> None:
    timeout_s = 2.0
    actor = RewardActor.remote([(HANG, 1.0)], timeout_s=timeout_s, num_workers=2)
    ray.get(actor.score.remote(["warm"], [""], [0]), timeout=120)  # actor and workers started
    start = time.perf_counter()
    ref = actor.score.remote(["HANG", "a", "HANG", "b"], [""] * 4, [0, 1, 0, 2])
    result = ray.get(ref, timeout=60)
    elapsed = time.perf_counter() - start
    assert result.rewards == [0.0, 1.0, 0.0, 1.0]
    assert result.metrics["reward/timeouts"] == 1.0
    assert elapsed < timeout_s + 5.0
    ray.get(actor.close.remote(), timeout=60)


def test_c05_wrong_length_raises_through_actor(ray_local: None) -> None:
    name = "tests.unit.reward_helpers:one_value"
    actor = RewardActor.remote([(name, 1.0)], timeout_s=5.0)
    with pytest.raises(ValueError, match="returned 1 values for a group of 3") as info:
        ray.get(actor.score.remote(["a", "b", "c"], ["x"] * 3, [0, 0, 0]), timeout=120)
    assert name in str(info.value)


def test_memory_eater_fails_alone_inside_actor(ray_local: None) -> None:
    eat = "tests.unit.reward_helpers:eat_on_marker"
    actor = RewardActor.remote([(eat, 1.0)], timeout_s=10.0, num_workers=1, memory_limit_mb=512)
    pid = ray.get(actor.score.remote(["warm"], [""], [0]), timeout=120).rewards[0]  # the worker's pid
    start = time.perf_counter()
    result = ray.get(actor.score.remote(["EAT", "b"], ["", ""], [0, 1]), timeout=60)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0  # the 8 GiB allocation is refused at once, far under timeout_s=10
    assert result.rewards == [0.0, pid]  # the other group scored by the same worker
    assert result.metrics["reward/memory_errors"] == 1.0 and result.metrics["reward/failed_frac"] == 0.5
    assert ray.get(actor.score.remote(["c"], [""], [0]), timeout=60).rewards == [pid]  # and it goes on
    ray.get(actor.close.remote(), timeout=60)


def test_streaming_calls_overlap_in_actor(ray_local: None) -> None:
    """Two slow per-group calls (1 s each) run at once in the job's reward actor (no reward model)."""
    from types import SimpleNamespace

    from actors.reward import start_reward_actor

    cfg = SimpleNamespace(functions=[SimpleNamespace(name="tests.unit.reward_helpers:sleep_one_second", weight=1.0)],
                          timeout_s=10.0, num_workers=2, memory_limit_mb=0, model_path=None)
    actor = start_reward_actor(cfg, {"num_cpus": 0})
    ray.get(actor.score.remote(["warm", "up"], ["", ""], [0, 1]), timeout=120)  # actor and both workers up
    start = time.perf_counter()
    refs = [actor.score.remote(["ab"], [""], [0]), actor.score.remote(["abc"], [""], [1])]
    results = ray.get(refs, timeout=60)
    elapsed = time.perf_counter() - start
    assert [r.rewards for r in results] == [[2.0], [3.0]]
    assert elapsed < 1.8, f"two 1 s reward calls took {elapsed:.2f} s in the actor: they did not overlap"
    ray.get(actor.close.remote(), timeout=60)
