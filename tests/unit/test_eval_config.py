"""The `eval` config section: errors name the key before any actor starts (orchestrator/eval/checks.py), and the
eval prompt set: a holdout never overlaps what training draws, eval.data drops what the run trains on
(orchestrator/eval/prompts.py).

    .venv/bin/python -m pytest tests/unit/test_eval_config.py -q
"""
from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.data import DatasetError, StatefulLoader, load_examples
from orchestrator.eval.checks import pass_function
from orchestrator.eval.prompts import eval_split, holdout_count

CFG = "configs/grpo_arith_cpu.yaml"


def test_demo_config_evaluates_greedy_pass_at_1_on_64_prompts_every_8_steps():
    cfg = load_config(CFG)
    e = cfg.eval
    assert (e.every_steps, e.data, e.num_prompts, e.n, e.temperature, list(e.k)) == (8, "arith", 64, 1, 0.0, [1])
    assert cfg.trainer.total_steps == 16 and pass_function(cfg) == "accuracy"


@pytest.mark.parametrize("overrides, key", [
    (["eval.every_steps=-1"], "eval.every_steps=-1 must be a finite number >= 0"),
    (["eval.n=0"], "eval.n=0 must be > 0"),
    (["eval.temperature=-0.5"], "eval.temperature=-0.5 must be a finite number >= 0"),
    (["eval.holdout=-1"], "eval.holdout=-1.0 must be a finite number >= 0"),
    (["eval.num_prompts=-2"], "eval.num_prompts=-2"),
    (["eval.holdout=0.2"], "eval.data='arith' and eval.holdout=0.2 are both set"),
    (["eval.data=null"], "eval.every_steps=8 needs eval prompts"),
    (["eval.k=[1,2]"], r"eval.k\[1\]=2 must be a whole number in \[1, eval.n=1\]"),
    (["eval.k=[]"], "eval.k is empty"),
    (["eval.n=4", "eval.temperature=1.0", "eval.k=[0]"], r"eval.k\[0\]=0"),
    (["eval.n=4", "eval.temperature=1.0", "eval.k=[2.5]"], r"eval.k\[0\]=2.5"),
    (["eval.n=4"], "eval.n=4 with eval.temperature=0 \\(greedy\\)"),
    (["eval.pass_function=nosuch"], "eval.pass_function='nosuch' is not a reward function"),
    (["eval.max_new_tokens=900"], "eval.max_new_tokens \\(900\\)"),
    (["eval.nosuch=1"], "eval.nosuch"),
])
def test_bad_eval_config_names_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_config(CFG, overrides)


def test_pass_function_auto_and_explicit():
    assert pass_function(load_config(CFG, ["eval.every_steps=0",
                                           "reward.functions=[{name: boxed_format}]"])) == "reward"
    cfg = load_config(CFG, ["reward.functions=[accuracy, boxed_format]", "eval.pass_function=boxed_format"])
    assert pass_function(cfg) == "boxed_format"


@pytest.mark.parametrize("overrides", [["eval.every_steps=0", "eval.data=null"], ["eval.every_steps=0"],
                                       ["eval.every_steps=0", "eval.data=null", "eval.holdout=0.5"]])
def test_eval_off_leaves_every_example_to_training(overrides):
    cfg = load_config(CFG, overrides + ["data.arith_size=20"])  # too few for 64 eval prompts: not made when off
    examples = load_examples(cfg.data)
    split = eval_split(cfg, examples)
    assert split.train_items == list(range(len(examples))) and split.prompts == []


def test_eval_data_leaves_training_unchanged_and_drops_what_the_run_trains_on():
    cfg = load_config(CFG)  # the demo: eval.data=arith, 64 prompts
    examples = load_examples(cfg.data)
    split = eval_split(cfg, examples)
    assert split.train_items == list(range(len(examples)))  # the training loader is the one without eval
    assert len(split.prompts) == 64 and len({p.prompt for p in split.prompts}) == 64 and split.dropped > 0
    loader = StatefulLoader(split.train_items, cfg.rollout.prompts_per_step, seed=cfg.data.seed, shuffle=cfg.data.shuffle)
    trained = {examples[k].prompt for _ in range(cfg.trainer.total_steps + 1) for k in loader.next_batch()}
    assert not trained & {p.prompt for p in split.prompts}


@pytest.mark.parametrize("holdout", ["0.25", "30"])
def test_holdout_never_overlaps_training_prompts(holdout):
    cfg = load_config(CFG, ["eval.data=null", f"eval.holdout={holdout}", "eval.num_prompts=0"])
    examples = load_examples(cfg.data)
    split = eval_split(cfg, examples)
    held = {p.prompt for p in split.prompts}
    distinct = len({e.prompt for e in examples})
    assert len(held) == (round(0.25 * distinct) if holdout == "0.25" else 30)
    # every item the loader can ever draw, over many epochs, is a training prompt outside the holdout
    loader = StatefulLoader(split.train_items, cfg.rollout.prompts_per_step, seed=cfg.data.seed)
    drawn = {examples[k].prompt for _ in range(3 * len(split.train_items)) for k in loader.next_batch()}
    assert drawn and not drawn & held
    assert {e.prompt for e in examples} == drawn | held  # only the held-out texts are gone
    assert eval_split(cfg, examples).prompts == split.prompts  # deterministic in eval.seed


def test_holdout_count_rules():
    assert holdout_count(0, 10) == 0 and holdout_count(0.25, 10) == 2 and holdout_count(0.01, 10) == 1
    assert holdout_count(3, 10) == 3
    with pytest.raises(ValueError, match="eval.holdout=2.5"):
        holdout_count(2.5, 10)
    with pytest.raises(ValueError, match="none would be left to train on"):
        holdout_count(10, 10)


def test_too_few_eval_prompts_and_bad_eval_file_name_the_key(tmp_path):
    cfg = load_config(CFG, ["eval.num_prompts=500"])
    with pytest.raises(DatasetError, match="eval.num_prompts=500"):
        eval_split(cfg, load_examples(cfg.data))
    cfg = load_config(CFG, [f"eval.data={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(DatasetError, match="eval.data="):
        eval_split(cfg, load_examples(cfg.data))


def test_eval_data_from_a_jsonl_file(tmp_path):
    f = tmp_path / "eval.jsonl"
    f.write_text('{"prompt": "What is 12 + 30?", "answer": "42"}\n{"prompt": "What is 2 + 2?", "answer": "4"}\n')
    cfg = load_config(CFG, [f"eval.data={f}", "eval.num_prompts=0"])
    split = eval_split(cfg, load_examples(cfg.data))
    assert [p.answer for p in split.prompts] == ["42", "4"]
    assert split.prompts[0].prompt.startswith("What is 12 + 30?")  # data.prompt_suffix appended
