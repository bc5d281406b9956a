"""Built-in rewards against built-in sources' gold answers, refused at load naming the keys
(orchestrator/config/source_reward.py): a reward that reads another kind of gold answer scores every sample 0,
passes every sample, or fails every call."""
from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.reward.code_tests import BadTestsError, parse_tests
from orchestrator.reward.functions import resolve_reward_fn

ARITH, CODE, RGYM = "configs/grpo_arith_cpu.yaml", "configs/grpo_code_cpu.yaml", "configs/grpo_reasoning_gym_cpu.yaml"


@pytest.mark.parametrize("config, overrides, message", [
    (ARITH, ["reward.functions=[code_tests]"], r"\['code_tests'\] cannot score data.source='arith'.*use 'accuracy'"),
    (RGYM, ["reward.functions=[code_tests]"], r"cannot score data.source='reasoning_gym:.*use 'reasoning_gym'"),
    (CODE, ["reward.functions=[accuracy]"], r"\['accuracy'\] cannot score data.source='code_arith'.*use 'code_tests'"),
    (ARITH, ["reward.functions=[reasoning_gym]"], r"\['reasoning_gym'\] cannot score data.source='arith'"),
    (ARITH, ["env.name=python"], r"env.kwargs.reward_fn=\['code_tests'\]: \['code_tests'\] cannot score data.source='arith', whose gold answers are numbers"),
    (ARITH, ["eval.data=reasoning_gym:chain_sum", "eval.holdout=0"],
     r"reward.functions=\['accuracy'\]: \['accuracy'\] cannot score eval.data='reasoning_gym:chain_sum'"),
    (RGYM, ["eval.data=arith", "eval.holdout=0"], r"\['reasoning_gym'\] cannot score eval.data='arith'"),
])
def test_a_reward_that_cannot_read_the_gold_answers_is_refused(config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(config, overrides)


@pytest.mark.parametrize("config, overrides", [
    (ARITH, []), (CODE, []), (RGYM, []),
    (ARITH, ["env.name=python", "env.kwargs={reward_fn: accuracy}"]),
    (ARITH, ["reward.functions=[accuracy, boxed_format]"]),
])
def test_matching_pairs_load(config, overrides):
    load_config(config, overrides)


def test_unit_tests_must_assert():
    with pytest.raises(BadTestsError, match="test 0 has no assert statement: '12'"):
        parse_tests("12")  # an arithmetic gold answer compiles as an expression: it would pass any code
    assert parse_tests("assert f(1) == 2\nassert f(2) == 3") == ["assert f(1) == 2", "assert f(2) == 3"]
    with pytest.raises(BadTestsError):
        resolve_reward_fn("code_tests")(["```python\npass\n```"], ["12"])
