"""Unit tests of the reward functions and RewardScorer (no Ray): cases C05 and C06.

Run: .venv/bin/python -m pytest tests/unit/test_reward.py -q
"""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from orchestrator.reward import (
    BUILTIN_REWARDS,
    RewardResult,
    RewardScorer,
    accuracy,
    boxed_format,
    extract_final_answer,
    resolve_reward_fn,
)

HELPERS = "tests.unit.reward_helpers"


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("3 + 5 = 8.", "8", 1.0),
        ("The answer is 8", "8", 1.0),
        ("The sum of 3 and 5 is 8.", "8", 1.0),
        ("3 + 5 = 9", "8", 0.0),
        ("\\boxed{4}", "4", 1.0),
        ("", "8", 0.0),
        ("qwerty !! ??", "8", 0.0),
        ("1,234", "1234", 1.0),
        ("1234", "1,234", 1.0),
        ("so it is 3/4", "0.75", 1.0),
        ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
        ("The answer is -5.", "-5", 1.0),
        ("First \\boxed{5}, no: \\boxed{6}", "6", 1.0),
        ("First \\boxed{6}, no: \\boxed{5}", "6", 0.0),
        ("\\boxed{8} and then 9", "8", 1.0),
        ("the answer is 8", "\\boxed{8}", 1.0),
    ],
)
def test_accuracy_hand_values(completion: str, gold: str, expected: float) -> None:
    assert accuracy([completion], [gold]) == [expected]


def test_extract_final_answer() -> None:
    assert extract_final_answer("3 + 5 = 8.") == "8"
    assert extract_final_answer("total 1,234.5 apples") == "1234.5"
    assert extract_final_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_final_answer("no digits") is None


def test_boxed_format() -> None:
    completions = ["\\boxed{4}", "\\boxed{}", "\\boxed{ }", "4", "", "x \\boxed{\\frac{1}{2}} y"]
    assert boxed_format(completions, [""] * 6) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_resolve_reward_fn() -> None:
    assert resolve_reward_fn("accuracy") is BUILTIN_REWARDS["accuracy"]
    colon = resolve_reward_fn(f"{HELPERS}:length")
    dotted = resolve_reward_fn(f"{HELPERS}.length")
    assert colon is dotted
    for bad in ("acuracy", "no_such_pkg.mod:fn", f"{HELPERS}:missing", f"{HELPERS}:NOT_CALLABLE"):
        with pytest.raises(ValueError, match="accuracy, boxed_format") as info:
            resolve_reward_fn(bad)
        assert repr(bad) in str(info.value)


@pytest.fixture(scope="module")
def scorer() -> Iterator[RewardScorer]:
    with RewardScorer([("accuracy", 1.0)], timeout_s=5.0, num_workers=2) as s:
        yield s


def test_start_brings_the_workers_up_before_the_first_score() -> None:
    scorer = RewardScorer([("accuracy", 1.0), (f"{HELPERS}:length", 0.5)], timeout_s=5.0, num_workers=1)
    try:
        assert scorer.start() > 0
        workers = psutil.Process().children(recursive=True)  # the forkserver and its worker, up before any score
        assert len(workers) >= 2, workers
        assert scorer.score(["\\boxed{4}"], ["4"], [0]).rewards[0] > 1.0
    finally:
        scorer.close()
    with pytest.raises(RuntimeError, match="start called after close"):
        scorer.start()


def test_c06a_boxed_scores_one_in_main_thread(scorer: RewardScorer) -> None:
    result = scorer.score(["Adding: 2 + 2 = \\boxed{4}"], ["4"], [0])
    assert isinstance(result, RewardResult)
    assert result.rewards == [1.0]
    assert result.metrics["reward/timeouts"] == 0.0
    assert result.metrics["reward/errors"] == 0.0


def test_c06a_boxed_scores_one_in_worker_threads(scorer: RewardScorer) -> None:
    out: list[list[float]] = []
    thread = threading.Thread(
        target=lambda: out.append(scorer.score(["\\boxed{4}"], ["4"], [0]).rewards)
    )
    thread.start()
    thread.join(timeout=30)
    assert out == [[1.0]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(
            pool.map(lambda _: scorer.score(["\\boxed{4}"], ["4"], [7]).rewards, range(2))
        )
    assert results == [[1.0], [1.0]]


def test_c06a_scorer_created_in_worker_thread() -> None:
    def create_and_score() -> list[float]:
        with RewardScorer([("accuracy", 1.0)], timeout_s=5.0, num_workers=1) as s:
            return s.score(["\\boxed{4}"], ["4"], [0]).rewards

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(create_and_score).result(timeout=60) == [1.0]


def test_c06b_hung_scorer_times_out_and_other_groups_score() -> None:
    timeout_s = 2.0
    completions = ["HANG", "HANG", "a", "b", "c"]
    group_ids = [0, 0, 1, 2, 1]
    functions = [(f"{HELPERS}:hang_on_marker", 1.0)]
    with RewardScorer(functions, timeout_s=timeout_s, num_workers=2) as s:
        s.score(["warm"], [""], [0])  # start the workers outside the timed call
        start = time.perf_counter()
        result = s.score(completions, [""] * 5, group_ids)
        elapsed = time.perf_counter() - start
    assert result.rewards == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert result.metrics["reward/timeouts"] == 1.0
    assert result.metrics["reward/errors"] == 0.0
    assert timeout_s <= elapsed < timeout_s + 5.0


def test_c06b_function_that_never_returns() -> None:
    start = time.perf_counter()
    with RewardScorer([(f"{HELPERS}:hang", 1.0), ("accuracy", 1.0)], timeout_s=2.0) as s:
        result = s.score(["\\boxed{4}", "\\boxed{5}"], ["4", "4"], [3, 3])
    assert time.perf_counter() - start < 2.0 + 5.0 + 5.0  # timeout + overhead + pool start
    assert result.per_function[f"{HELPERS}:hang"] == [0.0, 0.0]
    assert result.rewards == [1.0, 0.0]
    assert result.metrics["reward/timeouts"] == 1.0


def test_c05_wrong_length_raises_naming_function() -> None:
    name = f"{HELPERS}:one_value"
    with RewardScorer([(name, 1.0)], timeout_s=5.0) as s:
        with pytest.raises(ValueError) as info:
            s.score(["a", "b", "c"], ["x", "x", "x"], [0, 0, 0])
    message = str(info.value)
    assert repr(name) in message
    assert "returned 1 values for a group of 3" in message and "expected 3" in message


@pytest.mark.parametrize(
    ("helper", "match"), [("returns_nan", "non-finite"), ("returns_strings", "non-numeric")]
)
def test_bad_values_raise_naming_function(helper: str, match: str) -> None:
    with RewardScorer([(f"{HELPERS}:{helper}", 1.0)], timeout_s=5.0) as s:
        with pytest.raises(ValueError, match=match) as info:
            s.score(["a", "b"], ["x", "x"], [0, 0])
    assert helper in str(info.value)


def test_exception_inside_function_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    name = f"{HELPERS}:raise_on_marker"
    with RewardScorer([(name, 1.0)], timeout_s=5.0) as s:
        with caplog.at_level("WARNING", logger="orchestrator.reward.scorer"):
            result = s.score(["BOOM", "ok", "BOOM"], ["", "", ""], [0, 1, 0])
    assert result.rewards == [0.0, 0.5, 0.0]
    assert result.metrics["reward/errors"] == 1.0
    assert result.metrics["reward/timeouts"] == 0.0
    assert name in caplog.text and "reward helper exploded" in caplog.text


@pytest.mark.parametrize("helper", ["crash", "raise_timeout"])
def test_worker_crash_and_own_timeout_error_count_as_errors(helper: str) -> None:
    with RewardScorer([(f"{HELPERS}:{helper}", 1.0), ("accuracy", 1.0)], timeout_s=5.0) as s:
        result = s.score(["\\boxed{4}", "x"], ["4", "4"], [0, 1])
    assert result.rewards == [1.0, 0.0]
    assert result.metrics["reward/errors"] == 2.0
    assert result.metrics["reward/timeouts"] == 0.0
    assert result.metrics["reward/memory_errors"] == 0.0  # an exit code, not SIGKILL: an error
    assert result.metrics["reward/failed_frac"] == 0.5  # 2 of 4 calls (2 functions x 2 groups)


def test_name_unresolvable_in_worker_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("reward_only_in_parent")
    module.fn = lambda completions, answers: [1.0] * len(completions)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "reward_only_in_parent", module)
    with RewardScorer([("reward_only_in_parent:fn", 1.0)], timeout_s=5.0) as s:
        with pytest.raises(ValueError, match="reward worker process.*reward_only_in_parent:fn"):
            s.score(["a"], ["a"], [0])


def test_weights_combine_and_metrics() -> None:
    functions = [("accuracy", 1.0), ("boxed_format", 0.25)]
    with RewardScorer(functions, timeout_s=5.0) as s:
        result = s.score(["\\boxed{4}", "4", "\\boxed{5}", "nothing"], ["4"] * 4, [0, 0, 1, 1])
    assert result.per_function["accuracy"] == [1.0, 1.0, 0.0, 0.0]
    assert result.per_function["boxed_format"] == [1.0, 0.0, 1.0, 0.0]
    assert result.rewards == pytest.approx([1.25, 1.0, 0.25, 0.0], abs=1e-5)
    assert result.metrics["reward/accuracy_mean"] == pytest.approx(0.5, abs=1e-5)
    assert result.metrics["reward/boxed_format_mean"] == pytest.approx(0.5, abs=1e-5)
    assert result.metrics["reward/mean"] == pytest.approx(0.625, abs=1e-5)
    assert result.metrics["reward/score_s"] >= 0.0


@pytest.mark.parametrize("group_ids", [[0, 1, 0, 1, 0, 1], [5, 5, 9, 9, 5, 9], [2, 1, 0, 0, 1, 2]])
def test_interleaved_groups_keep_original_order(group_ids: list[int]) -> None:
    completions = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]
    with RewardScorer([(f"{HELPERS}:length", 1.0)], timeout_s=5.0) as s:
        result = s.score(completions, [""] * 6, group_ids)
    assert result.rewards == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_unknown_function_name_is_a_clear_error() -> None:
    expected = "unknown reward function 'acuracy'.*accuracy, boxed_format"
    with pytest.raises(ValueError, match=expected):
        RewardScorer([("acuracy", 1.0)])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RewardScorer([])
    with pytest.raises(ValueError, match="twice"):
        RewardScorer([("accuracy", 1.0), ("accuracy", 2.0)])
    with pytest.raises(ValueError, match="weight"):
        RewardScorer([("accuracy", float("inf"))])
    with RewardScorer([("accuracy", 1.0)]) as s:
        with pytest.raises(ValueError, match="2 completions, 1 answers"):
            s.score(["a", "b"], ["a"], [0, 0])
        assert s.score([], [], []).rewards == []
    with pytest.raises(RuntimeError, match="close"):
        s.score(["a"], ["a"], [0])
