"""data.source=reasoning_gym:<task> (orchestrator/data/rgym.py) and the reward `reasoning_gym` (orchestrator/reward/rgym.py):
rows deterministic in the seed, the task's own scorer as the reward, and the errors, before any actor starts."""
from __future__ import annotations

import json

import pytest
import reasoning_gym

from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.data import DatasetError, load_examples
from orchestrator.reward import RewardScorer, resolve_reward_fn
from orchestrator.reward.rgym import extract_answer_text, reasoning_gym_reward

EASY = "data.reasoning_gym.config={min_terms: 2, max_terms: 2, max_digits: 1}"


def _cfg(*extra, task="basic_arithmetic"):
    return load_config(None, [f"data.source=reasoning_gym:{task}", "reward.functions=[reasoning_gym]", *extra])


def _gold(example) -> str:
    return json.loads(example.answer)["answer"]


def test_rows_are_the_tasks_entries_and_deterministic_in_the_seed():
    rows = load_examples(_cfg(EASY, "data.reasoning_gym.size=20", "data.seed=3").data)
    again = load_examples(_cfg(EASY, "data.reasoning_gym.size=20", "data.seed=3").data)
    other = load_examples(_cfg(EASY, "data.reasoning_gym.size=20", "data.reasoning_gym.seed=4").data)
    assert len(rows) == 20 and rows == again and rows != other
    # the library's own entries, generated with the same parameters: the question is the prompt
    ds = reasoning_gym.create_dataset("basic_arithmetic", min_terms=2, max_terms=2, max_digits=1, size=20, seed=3)
    assert [r.prompt for r in rows] == [ds[i]["question"] for i in range(20)]
    assert [_gold(r) for r in rows] == [ds[i]["answer"] for i in range(20)]
    assert json.loads(rows[5].answer)["index"] == 5


def test_prompt_suffix_is_appended():
    rows = load_examples(_cfg("data.reasoning_gym.size=2", "data.prompt_suffix='Answer:'", task="leg_counting").data)
    assert all(r.prompt.endswith(" Answer:") and "legs" in r.prompt for r in rows)


@pytest.mark.parametrize("task", ["basic_arithmetic", "leg_counting", "chain_sum"])
def test_the_tasks_scorer_gives_1_for_the_right_answer_and_less_for_a_wrong_one(task):
    rows = load_examples(_cfg("data.reasoning_gym.size=4", task=task).data)
    for row in rows:
        gold = _gold(row)
        wrong = str(int(gold) + 1)
        got = reasoning_gym_reward([f"So: <answer>{gold}</answer>", f"<answer>{wrong}</answer>", "no tags " + gold],
                                   [row.answer] * 3)
        assert got[0] == 1.0 and got[1] < 1.0 and got[2] == 0.0  # answer_tag: no <answer> tag, no answer


def test_answer_formats():
    assert extract_answer_text("think\n<answer> 12 </answer>\n<answer>13</answer>", "answer_tag") == "13"
    assert extract_answer_text("a\nthe answer is 7\n\n", "last_line") == "the answer is 7"
    assert extract_answer_text("3 + 4 = 7.", "final_answer") == "7"
    assert extract_answer_text("nothing", "answer_tag") is None and extract_answer_text("", "last_line") is None
    rows = load_examples(_cfg(EASY, "data.reasoning_gym.size=3", "data.reasoning_gym.answer_format=final_answer").data)
    golds = [_gold(r) for r in rows]
    assert reasoning_gym_reward([f"so it is {g}." for g in golds], [r.answer for r in rows]) == [1.0] * 3


def test_runs_through_the_scorer_by_name():
    assert resolve_reward_fn("reasoning_gym") is reasoning_gym_reward
    rows = load_examples(_cfg(EASY, "data.reasoning_gym.size=2").data)
    completions = [f"<answer>{_gold(rows[0])}</answer>", "<answer>x</answer>"]
    with RewardScorer([("reasoning_gym", 1.0)], num_workers=1) as scorer:
        result = scorer.score(completions, [rows[0].answer] * 2, [0, 0])
    assert result.rewards == [1.0, 0.0] and result.metrics["reward/errors"] == 0


def test_a_plain_answer_is_not_a_reference():
    with pytest.raises(ValueError, match="not a reasoning-gym row reference"):
        reasoning_gym_reward(["<answer>8</answer>"], ["8"])


@pytest.mark.parametrize("extra, message", [
    (["data.source=reasoning_gym:no_such_task"], "data.source='reasoning_gym:no_such_task': reasoning-gym has no task"),
    (["data.reasoning_gym.config={min_terms: 2, colour: 3}"], "data.reasoning_gym.config: task 'basic_arithmetic' "
                                                             "has no parameter colour; its parameters are min_terms"),
    (["data.reasoning_gym.config={min_terms: 0}"], "task 'basic_arithmetic' refuses it: min_terms must be positive"),
    (["data.reasoning_gym.config={seed: 1}"], "data.reasoning_gym.config.seed: set data.reasoning_gym.seed instead"),
    (["data.reasoning_gym.size=0"], "data.reasoning_gym.size=0 must be > 0"),
    (["data.reasoning_gym.answer_format=xml"], "data.reasoning_gym.answer_format='xml' is not allowed"),
    (["reward.functions=[accuracy]"], "\\['accuracy'\\] cannot score data.source='reasoning_gym:.*use 'reasoning_gym'"),
])
def test_bad_input_is_a_config_error_naming_the_key(extra, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(*extra)


def test_load_examples_names_data_source_for_an_unknown_task():
    cfg = load_config(None, [])  # load_examples is also reached without the config check (eval, tools)

    class Data:
        source, seed, prompt_suffix, reasoning_gym = "reasoning_gym:nope", 0, "", cfg.data.reasoning_gym

    with pytest.raises(DatasetError, match="data.source='reasoning_gym:nope'"):
        load_examples(Data)


def test_eval_data_draws_the_task_with_eval_seed():
    from orchestrator.eval.prompts import eval_examples

    over = [EASY, "data.reasoning_gym.size=30", "data.reasoning_gym.seed=1", "eval.data=reasoning_gym:basic_arithmetic",
            "eval.seed=9", "eval.every_steps=1", "eval.num_prompts=4"]
    rows = eval_examples(_cfg(*over))
    ds = reasoning_gym.create_dataset("basic_arithmetic", min_terms=2, max_terms=2, max_digits=1, size=30, seed=9)
    assert [r.prompt for r in rows] == [ds[i]["question"] for i in range(30)]
    assert json.loads(rows[0].answer)["config"]["seed"] == 9
