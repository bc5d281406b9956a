"""maj@k by the eval source's kind of gold answer (orchestrator/eval/majority.py): reasoning-gym references vote on
the answer their reward reads against the reference's gold answer (not the JSON reference), unit-test sources report
no maj@k, plain answers are unchanged."""
from __future__ import annotations

import json

from orchestrator.eval.majority import majority_inputs
from orchestrator.eval.metrics import summarize


def _ref(answer: str, fmt: str = "final_answer") -> str:
    return json.dumps({"reasoning_gym": "basic_arithmetic", "index": 0, "config": {}, "answer": answer,
                       "answer_format": fmt})


def test_reasoning_gym_references_vote_on_their_gold_answer():
    texts = [["so 3 + 4 = 7", "it is 8", "7"], ["<answer>12</answer>", "<answer>11</answer>", "no idea"]]
    finals, golds = majority_inputs("reference", texts, [_ref("7"), _ref("12", "answer_tag")])
    assert finals == [["7", "8", "7"], ["12", "11", None]] and golds == ["7", "12"]
    out = summarize([[True, False, True], [True, False, False]], finals, golds, [1, 3])
    assert out["eval/maj_at_3"] == 1.0 and out["eval/maj_at_1"] == 1.0  # the first samples: 7 and 12
    assert abs(out["eval/pass_at_1"] - 0.5) < 1e-12


def test_unit_test_sources_report_no_majority_and_plain_answers_are_unchanged():
    assert majority_inputs("tests", [["def f(x): return x"]], ["assert f(1) == 1"]) == (None, None)
    out = summarize([[True, False]], None, None, [1, 2])
    assert "eval/maj_at_1" not in out and out["eval/pass_at_1"] == 0.5 and out["eval/pass_at_2"] == 1.0
    finals, golds = majority_inputs("answer", [["The answer is \\boxed{5}", "5"]], ["5"])
    assert finals == [["5", "5"]] and golds == ["5"]
    assert majority_inputs(None, [["x = 2"]], ["2"]) == ([["2"]], ["2"])
