"""The built-in coding task (data.source=code_arith): deterministic rows whose tests a reference solution passes."""
from __future__ import annotations

import pytest

from orchestrator.config.load import load_config
from orchestrator.data import load_examples
from orchestrator.data.code_tasks import code_arith_examples
from orchestrator.reward.code_tests import code_tests, parse_tests


def test_rows_are_deterministic_in_the_seed_and_hold_four_tests():
    rows = code_arith_examples(50, 0, 9, seed=3)
    assert rows == code_arith_examples(50, 0, 9, seed=3) and rows != code_arith_examples(50, 0, 9, seed=4)
    for row in rows:
        assert row.prompt.startswith("Write a Python function f(x) that returns ") and "```python" in row.prompt
        assert len(parse_tests(row.answer)) == 4


def test_the_tests_are_right_a_reference_passes_all_and_a_wrong_one_not():
    row = next(r for r in code_arith_examples(200, 2, 9, seed=0) if "x times" in r.prompt)
    factor = int(row.prompt.split("x times ")[1].split(".")[0])
    right = f"```python\ndef f(x):\n    return x * {factor}\n```"
    wrong = f"```python\ndef f(x):\n    return x * {factor + 1}\n```"
    assert code_tests([right, wrong], [row.answer] * 2)[0] == 1.0
    assert code_tests([right, wrong], [row.answer] * 2)[1] < 1.0


def test_the_config_loads_the_task_and_the_reward():
    cfg = load_config("configs/grpo_code_cpu.yaml")
    assert cfg.data.source == "code_arith" and cfg.reward.functions[0]["name"] == "code_tests"
    assert len(load_examples(cfg.data)) == cfg.data.arith_size
    with pytest.raises(ValueError, match="arith_size=0"):
        code_arith_examples(0, 0, 9, seed=0)
