"""Held-out eval metrics (orchestrator/eval/metrics.py) against hand-computed values.

    .venv/bin/python -m pytest tests/unit/test_eval_metrics.py -q
"""
from __future__ import annotations

from math import comb

import pytest

from orchestrator.eval.metrics import (avg_at_k, maj_at_k, majority_answer, pass_at_k, response_stats,
                                       summarize)


def exact(a: str, b: str) -> bool:
    return a == b


def test_pass_at_k_unbiased_estimator_chen_eq1():
    # the check: n = 10, c = 3, k = 5: 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(10, 3, 5) == pytest.approx(0.916667, abs=1e-6)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252, abs=1e-12)
    for n, c, k in [(4, 1, 1), (4, 1, 2), (4, 2, 3), (20, 5, 10), (8, 0, 4), (8, 8, 1), (5, 2, 4)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12), (n, c, k)
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: every draw of 4 holds a correct one
    assert pass_at_k(8, 0, 4) == 0.0


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_avg_at_k_is_the_mean_of_the_first_k():
    assert avg_at_k([True, False, True, True], 1) == 1.0
    assert avg_at_k([True, False, True, True], 2) == 0.5
    assert avg_at_k([True, False, True, True], 4) == 0.75
    with pytest.raises(ValueError, match="avg@k"):
        avg_at_k([True], 2)


def test_majority_vote_counts_answers_not_nones_and_breaks_ties_by_first_seen():
    assert majority_answer(["8", "9", "8", None]) == "8"
    assert majority_answer([None, "9", "8", "8", "9"]) == "9"  # tie 2-2: "9" was seen first
    assert majority_answer([None, None]) is None
    assert majority_answer([" 8", "8 "]) == "8"


def test_maj_at_k_hand_computed():
    finals = ["7", "8", "8", "7", "7"]
    assert maj_at_k(finals, "8", 1, exact) == 0.0  # vote of ["7"]
    assert maj_at_k(finals, "8", 3, exact) == 1.0  # ["7","8","8"] -> 8
    assert maj_at_k(finals, "8", 5, exact) == 0.0  # 7 x3 vs 8 x2
    assert maj_at_k([None, None], "8", 2, exact) == 0.0  # no answer: wrong
    with pytest.raises(ValueError, match="maj@k"):
        maj_at_k(finals, "8", 6, exact)


def test_summarize_hand_computed():
    # prompt A (gold 8): correct, wrong, correct, wrong; finals 8, 9, 8, 9 -> c = 2
    # prompt B (gold 3): wrong x3, correct;               finals 4, 4, None, 3 -> c = 1
    correct = [[True, False, True, False], [False, False, False, True]]
    finals = [["8", "9", "8", "9"], ["4", "4", None, "3"]]
    out = summarize(correct, finals, ["8", "3"], [1, 2, 4], match=exact)
    assert out["eval/pass_at_1"] == pytest.approx((2 / 4 + 1 / 4) / 2)  # 0.375
    # pass@2: A 1 - C(2,2)/C(4,2) = 5/6; B 1 - C(3,2)/C(4,2) = 1/2
    assert out["eval/pass_at_2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert out["eval/pass_at_4"] == pytest.approx(1.0)
    assert out["eval/avg_at_1"] == pytest.approx((1 + 0) / 2)
    assert out["eval/avg_at_2"] == pytest.approx((0.5 + 0) / 2)
    assert out["eval/avg_at_4"] == pytest.approx((0.5 + 0.25) / 2)
    # maj@1: A "8" right, B "4" wrong; maj@2: A 8 vs 9 tie -> "8" right, B "4" wrong; maj@4: A tie -> 8, B "4" x2
    assert out["eval/maj_at_1"] == 0.5 and out["eval/maj_at_2"] == 0.5 and out["eval/maj_at_4"] == 0.5


def test_summarize_greedy_pass_at_1_is_the_accuracy_and_maj_uses_answers_match():
    out = summarize([[True], [False], [True], [True]], [["8"], ["1"], ["3.0"], ["12"]], ["8", "2", "3", "12"], [1])
    assert out["eval/pass_at_1"] == 0.75
    assert out["eval/maj_at_1"] == 0.75  # "3.0" matches "3" by math-verify (the default match)


def test_summarize_rejects_ragged_or_empty():
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([[True], [True, False]], [["1"], ["1", "2"]], ["1", "2"], [1], match=exact)
    with pytest.raises(ValueError, match="P >= 1"):
        summarize([], [], [], [1], match=exact)


def test_response_stats():
    out = response_stats([10, 20, 30, 40], ["stop", "length", "stop", "length"])
    assert out == {"eval/response_len_mean": 25.0, "eval/truncated_frac": 0.5}
    with pytest.raises(ValueError):
        response_stats([], [])
