"""The code_tests reward: fraction of unit tests passed, by hand, and through the reward scorer's workers."""
from __future__ import annotations

import pytest

from orchestrator.reward import RewardScorer, resolve_reward_fn
from orchestrator.reward.code_tests import BadTestsError, code_tests, extract_code, parse_tests

TESTS = "assert f(0) == 1\nassert f(1) == 3\nassert f(2) == 5\nassert f(3) == 7"  # f(x) = 2x + 1


def block(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


CORRECT = block("def f(x):\n    return 2 * x + 1")
HALF = block("def f(x):\n    return 2 * x + 1 if x % 2 == 0 else 0")  # passes f(0), f(2): 2 of 4
BROKEN = block("def f(x)\n    return 2 * x + 1")  # syntax error
LOOPS = block("def f(x):\n    while True:\n        pass")
EXITS = block("import os\nos._exit(0)")  # exits before any test: passes none
RAISES_ON_ONE = block("def f(x):\n    if x == 1:\n        raise RuntimeError('no')\n    return 2 * x + 1")


def test_fraction_of_tests_by_hand():
    assert code_tests([CORRECT, HALF, BROKEN], [TESTS] * 3) == [1.0, 0.5, 0.0]


def test_one_failure_does_not_hide_the_others_and_timeouts_and_exits_score_zero():
    assert code_tests([RAISES_ON_ONE, LOOPS, EXITS, "no code at all"], [TESTS] * 4) == [0.75, 0.0, 0.0, 0.0]


ABUSERS = [block("import os\nwhile True:\n    os.fork()"),
           block("buf = bytearray(30 << 30)\ndef f(x):\n    return 2 * x + 1"),
           block("import socket\nsocket.create_connection(('example.com', 80))\ndef f(x):\n    return 2 * x + 1"),
           block("import sys\nsys.stdout.write('x' * (1 << 30))\ndef f(x):\n    return 2 * x + 1")]


def test_resource_abuse_scores_zero():
    assert code_tests(ABUSERS, [TESTS] * len(ABUSERS)) == [0.0] * len(ABUSERS)


def test_extract_code_and_parse_tests():
    assert extract_code("```py\na = 1\n```\ntext\n```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("```python\nd = 4") == "d = 4"  # cut off before the closing fence
    assert extract_code("no fence here") is None
    assert parse_tests('["assert f(1) == 3", "x = f(2)\\nassert x == 5"]') == ["assert f(1) == 3", "x = f(2)\nassert x == 5"]
    assert parse_tests("# header\nassert f(1) == 3\n\nassert f(2) == 5") == ["assert f(1) == 3", "assert f(2) == 5"]
    with pytest.raises(BadTestsError, match="no unit test"):
        parse_tests("  ")
    with pytest.raises(BadTestsError, match="test 1 does not compile"):
        parse_tests("assert f(1) == 3\nassert f(2) ==")


def test_code_tests_is_a_builtin_and_scores_in_the_reward_workers():
    assert resolve_reward_fn("code_tests") is code_tests
    with RewardScorer([("code_tests", 1.0)], timeout_s=60, num_workers=2, memory_limit_mb=4096) as scorer:
        result = scorer.score([CORRECT, HALF, LOOPS, CORRECT, *ABUSERS], [TESTS] * 8, [0, 0, 1, 1, 2, 2, 2, 2])
        assert result.rewards == [1.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # the abuse scores 0, the run goes on
        assert result.metrics["reward/failed_frac"] == 0.0 and result.metrics["reward/code_tests_mean"] == 0.3125
        bad = scorer.score([CORRECT], ["assert f(1) =="], [0])  # a malformed test: a data error, counted
    assert bad.rewards == [0.0] and bad.metrics["reward/errors"] == 1.0 and bad.failures.failed_frac == 1.0
