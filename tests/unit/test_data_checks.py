"""orchestrator/data/checks.py: data.source and eval.data fail at config load, naming the key, when a
built-in task's ranges or operators are bad or a reasoning-gym task cannot be built (eval.data included)."""
from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.config.load import ConfigError

CODE = ["data.source=code_arith", "reward.functions=[{name: code_tests, weight: 1}]"]
EVAL_RG = ["eval.holdout=0", "eval.data=reasoning_gym:basic_arithmetic"]


@pytest.mark.parametrize("extra, message", [
    (["data.arith_min=5", "data.arith_max=1"], r"data.arith_min=5, data.arith_max=1 \(data.source='arith'\)"),
    (["data.arith_size=0"], r"data.arith_size=0, .*need arith_size >= 1"),
    (["data.arith_ops=[/]"], r"data.arith_ops=\['/'\]: allowed operators are"),
    ([*CODE, "data.arith_size=0"], r"data.arith_size=0, .*\(data.source='code_arith'\)"),
    (["eval.holdout=0", "eval.data=reasoning_gym:nope"], r"eval.data='reasoning_gym:nope': reasoning-gym has no task"),
    ([*EVAL_RG, "data.reasoning_gym.config={max_terms: 1}"], r"task 'basic_arithmetic' refuses it: max_terms"),
    # data.reasoning_gym.config is the training task's; an eval.data task that does not take it is named
    (["data.source=reasoning_gym:basic_arithmetic", "reward.functions=[reasoning_gym]", "eval.holdout=0",
      "eval.data=reasoning_gym:leg_counting", "data.reasoning_gym.config={max_terms: 2}"],
     r"eval.data='reasoning_gym:leg_counting': data.reasoning_gym.config: task 'leg_counting' has no parameter"),
    ([*CODE, "data.arith_ops=[/]"], r"data.arith_ops=\['/'\]: .* \(eval.data='arith'\)"),  # the demo's eval.data
])
def test_bad_sources_fail_at_load_naming_the_key(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/grpo_arith_cpu.yaml", extra)


def test_good_sources_load():
    assert load_config("configs/grpo_arith_cpu.yaml", [*CODE, "data.arith_ops=[/]", "eval.data=null", "eval.every_steps=0"]).data.source == "code_arith"
    rg = ["data.source=reasoning_gym:basic_arithmetic", "reward.functions=[reasoning_gym]"]
    assert load_config("configs/grpo_arith_cpu.yaml", [*rg, *EVAL_RG]).eval.data == "reasoning_gym:basic_arithmetic"
    assert load_config("configs/grpo_arith_cpu.yaml", ["eval.holdout=0", "eval.data=/no/such/file.jsonl"])
