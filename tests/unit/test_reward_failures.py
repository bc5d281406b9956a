"""The failure policy of reward calls (orchestrator/reward/failures.py) and the scorer's memory limit.

One policy for a call that raises, times out or runs out of memory: scored 0, counted by kind, and the run
stops only when the step's failed fraction exceeds `reward.max_failed_frac`. Each scorer worker runs under
`reward.memory_limit_mb` (RLIMIT_DATA), so a function that eats memory fails alone and fast.

Run: .venv/bin/python -m pytest tests/unit/test_reward_failures.py -q
"""
from __future__ import annotations

import resource
import time
from types import SimpleNamespace

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.reward import FailureTally, RewardScorer, TooManyFailuresError, check_reward_failures
from orchestrator.reward.failures import check_failed_frac, failure_metrics

HELPERS = "tests.unit.reward_helpers"
EAT = f"{HELPERS}:eat_on_marker"
REWARD_CFG = SimpleNamespace(max_failed_frac=0.5, timeout_s=2.0, memory_limit_mb=512)


def tally(calls: int, **by_name: dict) -> FailureTally:
    t = FailureTally(calls=calls)
    for name, kinds in by_name.items():
        for kind, n in kinds.items():
            t.add(name, kind, n)
    return t


# ---- the pure policy ------------------------------------------------------------------------------------
def test_tally_counts_kinds_and_fraction():
    t = tally(8, a={"timeout": 2, "error": 1}, b={"memory": 1})
    assert (t.count("timeout"), t.count("error"), t.count("memory"), t.failed) == (2, 1, 1, 4)
    assert t.failed_frac == 0.5
    assert t.describe() == "'a': 2 timeouts, 1 error; 'b': 1 memory error"
    assert failure_metrics(t, "reward") == {"reward/timeouts": 2.0, "reward/errors": 1.0,
                                            "reward/memory_errors": 1.0, "reward/failed_frac": 0.5}
    assert FailureTally().failed_frac == 0.0  # a step without calls
    with pytest.raises(ValueError, match="'crash' is not one of"):
        t.add("a", "crash")


@pytest.mark.parametrize(("failed", "limit", "stops"), [
    (4, 0.5, False),  # exactly the limit: goes on (the rule is failed_frac > limit)
    (5, 0.5, True),
    (8, 1.0, False),  # 1.0: never stops, even when every call failed
    (1, 0.0, True),   # 0.0: any failure stops
    (0, 0.0, False),
])
def test_stops_only_past_the_fraction(failed: int, limit: float, stops: bool):
    t = tally(8, f={"error": failed})
    if stops:
        with pytest.raises(TooManyFailuresError):
            check_failed_frac(t, limit, step=3, what="calls", setting="reward.max_failed_frac")
    else:
        assert check_failed_frac(t, limit, step=3, what="calls", setting="reward.max_failed_frac") is None


def test_stop_message_names_functions_counts_kinds_and_what_to_do():
    result = SimpleNamespace(failures=tally(4, **{"pkg.mod:slow": {"timeout": 2}, "pkg.mod:big": {"memory": 1}}))
    with pytest.raises(TooManyFailuresError) as info:
        check_reward_failures(result, REWARD_CFG, step=7)
    message = str(info.value)
    for text in ("step 7", "3 of 4 reward function calls", "75% > reward.max_failed_frac=0.5",
                 "'pkg.mod:slow': 2 timeouts", "'pkg.mod:big': 1 memory error", "in all 2 timed out, 1 ran out of memory",
                 "reward.timeout_s (now 2 s)", "reward.memory_limit_mb (now 512", "1.0 never stops"):
        assert text in message, (text, message)
    assert "traceback" not in message  # no function raised: the advice for errors is left out


# ---- the scorer: timeouts and errors get the same policy ----------------------------------------------
@pytest.mark.parametrize(("helper", "kind"), [("hang", "timeouts"), ("raise_on_marker", "errors")])
def test_every_call_failing_stops_alike_for_timeouts_and_errors(helper: str, kind: str):
    with RewardScorer([(f"{HELPERS}:{helper}", 1.0)], timeout_s=1.0, num_workers=2) as s:
        result = s.score(["BOOM", "BOOM", "BOOM"], [""] * 3, [0, 1, 1])
    assert result.rewards == [0.0, 0.0, 0.0]
    assert result.metrics[f"reward/{kind}"] == 2.0 and result.metrics["reward/failed_frac"] == 1.0
    assert result.failures.calls == 2
    with pytest.raises(TooManyFailuresError, match=f"2 of 2 reward function calls.*{helper}"):
        check_reward_failures(result, REWARD_CFG, step=1)


def test_some_failures_are_scored_zero_and_the_run_goes_on():
    functions = [(f"{HELPERS}:raise_on_marker", 1.0), ("accuracy", 1.0)]
    with RewardScorer(functions, timeout_s=5.0, num_workers=2) as s:
        result = s.score(["BOOM", "\\boxed{4}", "\\boxed{4}"], ["4"] * 3, [0, 0, 1])
    assert result.rewards == [0.0, 1.0, 1.5]  # the failed call is 0 for its function and group only
    assert result.metrics["reward/failed_frac"] == 0.25
    check_reward_failures(result, REWARD_CFG, step=1)  # 1 of 4 <= 0.5: no error


# ---- the memory limit ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def limited() -> RewardScorer:
    with RewardScorer([(EAT, 1.0)], timeout_s=10.0, num_workers=1, memory_limit_mb=512) as s:
        s.score(["warm"], [""], [0])  # the worker started outside the timed calls
        yield s


def test_8_gib_allocation_fails_fast_alone_and_the_worker_scores_on(limited: RewardScorer):
    before = limited.score(["x"], [""], [0]).rewards[0]  # the worker's pid
    start = time.perf_counter()
    result = limited.score(["EAT", "y"], ["", ""], [0, 1])
    elapsed = time.perf_counter() - start
    print(f"8 GiB allocation under a 512 MiB limit: failed after {elapsed * 1000:.0f} ms")
    assert elapsed < 2.0  # far under timeout_s=10: the allocation is refused, not waited out
    assert result.rewards == [0.0, before]  # the other group scored, by the same worker
    assert result.metrics["reward/memory_errors"] == 1.0 and result.metrics["reward/errors"] == 0.0
    assert result.failures.by_name == {EAT: {"memory": 1}}
    assert limited.score(["z"], [""], [0]).rewards == [before]  # the same worker goes on


def test_gradual_allocation_fails_before_the_timeout_and_the_pool_goes_on(limited: RewardScorer):
    start = time.perf_counter()
    result = limited.score(["NIBBLE"], [""], [0])
    elapsed = time.perf_counter() - start
    print(f"1 MiB pieces up to a 512 MiB limit: failed after {elapsed * 1000:.0f} ms")
    assert elapsed < 5.0
    assert result.rewards == [0.0] and result.metrics["reward/failed_frac"] == 1.0
    assert result.metrics["reward/memory_errors"] + result.metrics["reward/errors"] == 1.0
    assert limited.score(["z"], [""], [0]).rewards[0] > 0  # a pid: scoring goes on


def test_worker_killed_by_sigkill_counts_as_memory_and_is_replaced():
    with RewardScorer([(f"{HELPERS}:sigkill_self", 1.0), (EAT, 1.0)], timeout_s=10.0, num_workers=1) as s:
        result = s.score(["a"], [""], [0])
        assert result.metrics["reward/memory_errors"] == 1.0 and result.metrics["reward/errors"] == 0.0
        assert result.per_function[EAT][0] > 0  # the pool started a new worker for the other call
        assert s.score(["b"], [""], [0]).per_function[EAT][0] > 0


@pytest.mark.parametrize(("limit_mb", "expected"), [(512, 512 << 20), (0, None)])
def test_limit_is_set_in_the_workers_only(limit_mb: int, expected):
    own = resource.getrlimit(resource.RLIMIT_DATA)
    with RewardScorer([(f"{HELPERS}:data_limit", 1.0)], timeout_s=10.0, num_workers=1,
                      memory_limit_mb=limit_mb) as s:
        seen = s.score(["a"], [""], [0]).rewards[0]
    unlimited = -1.0 if own[0] == resource.RLIM_INFINITY else float(own[0])
    assert seen == (float(expected) if expected else unlimited)
    # the scorer's own process (the RewardActor, where the reward model runs) keeps its limit
    assert resource.getrlimit(resource.RLIMIT_DATA) == own


def test_bad_limit_and_config_keys():
    with pytest.raises(ValueError, match="memory_limit_mb must be >= 0"):
        RewardScorer([("accuracy", 1.0)], memory_limit_mb=-1)
    cfg = load_config(None, [])
    assert (cfg.reward.memory_limit_mb, cfg.reward.max_failed_frac) == (4096, 0.5)
    for override, key in [("reward.max_failed_frac=1.5", "reward.max_failed_frac"),
                          ("reward.memory_limit_mb=-1", "reward.memory_limit_mb")]:
        with pytest.raises(ConfigError, match=key):
            load_config(None, [override])
