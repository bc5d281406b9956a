"""The worked examples of docs/extending.md: an environment and a reward function of the user's own, named by
dotted path in the config (docs/examples/my_env.py, docs/examples/my_reward.py). Each is loaded through the
same resolution the run uses (the config's validation, `resolve_env_factory`, `resolve_reward_fn`, the reward
scorer's worker processes) and run on real rows of the built-in arithmetic task.

    .venv/bin/python -m pytest tests/unit/test_extending_env_reward.py -q
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.data.datasets import load_examples
from orchestrator.reward import RewardScorer, resolve_reward_fn
from orchestrator.envs.env import check_step, make_env, resolve_env_factory
from orchestrator.envs.env_runner import EnvRunner

ROOT = Path(__file__).resolve().parents[2]
ENV = "docs.examples.my_env:RetryArithEnv"
REWARD = "docs.examples.my_reward:number_at_end"
# The overrides docs/examples/my_env.py and my_reward.py show, on the configs they name.
ENV_OVERRIDES = [f"env.name={ENV}", "env.kwargs={max_attempts: 3, attempt_penalty: 0.25}", "env.max_turns=3",
                 "env.max_tokens=512", "rollout.block_size=32"]
REWARD_OVERRIDE = f'reward.functions=[{{name: accuracy, weight: 1.0}}, {{name: "{REWARD}", weight: 0.2}}]'


def _rows(cfg, k=4):
    """The first k rows of the run's dataset, as the multi-turn phase hands them to reset (seed = group id)."""
    return [{"prompt": e.prompt, "answer": e.answer, "seed": i} for i, e in enumerate(load_examples(cfg.data)[:k])]


def test_env_resolves_from_the_config_by_dotted_path():
    from docs.examples.my_env import RetryArithEnv

    cfg = load_config(ROOT / "configs/grpo_arith_cpu.yaml", ENV_OVERRIDES)  # validation resolves env.name
    assert cfg.env.name == ENV and dict(cfg.env.kwargs) == {"max_attempts": 3, "attempt_penalty": 0.25}
    assert resolve_env_factory(cfg.env.name) is RetryArithEnv
    assert resolve_env_factory("docs.examples.my_env.RetryArithEnv") is RetryArithEnv  # the dot form too
    with pytest.raises(ConfigError, match="env.name.*no attribute 'NoSuchEnv'"):
        load_config(ROOT / "configs/grpo_arith_cpu.yaml", ["env.name=docs.examples.my_env:NoSuchEnv"])
    # Why the docs start from grpo_arith_cpu.yaml: a command-line mapping merges into the file's env.kwargs.
    merged = load_config(ROOT / "configs/grpo_guessing_cpu.yaml", ENV_OVERRIDES)
    assert dict(merged.env.kwargs) == {"low": 1, "high": 10, "max_turns": 4, "turn_penalty": 0.2,
                                       "max_attempts": 3, "attempt_penalty": 0.25}


def test_env_plays_real_rows_through_the_env_runner():
    cfg = load_config(ROOT / "configs/grpo_arith_cpu.yaml", ENV_OVERRIDES)
    rows = _rows(cfg)
    runner = EnvRunner(resolve_env_factory(cfg.env.name), dict(cfg.env.kwargs),
                       num_workers=cfg.env.num_workers, step_timeout_s=cfg.env.step_timeout_s)

    async def episode(row, answers):
        env = await runner.make()
        opening = await runner.reset(env, row)
        steps = [await runner.step(env, a) for a in answers]
        return opening, steps

    async def play():
        right = [episode(r, [f"It is {r['answer']}."]) for r in rows]
        second = [episode(r, ["I think 1000", f"{r['answer']}"]) for r in rows]
        never = [episode(r, ["1000", "x", "-1000"]) for r in rows]
        return await asyncio.gather(*right, *second, *never)

    results = asyncio.run(play())
    n = len(rows)
    for row, (opening, steps) in zip(rows, results[:n]):
        assert opening == [{"role": "user", "content": f"{row['prompt']} Reply with the number only."}]
        assert [(s.reward, s.done) for s in steps] == [(1.0, True)]
    for opening, steps in results[n:2 * n]:
        assert [(s.observation, s.reward, s.done) for s in steps] == [
            ([{"role": "user", "content": "Not quite. Try again."}], 0.0, False), ("Correct.", 0.75, True)]
    for row, (opening, steps) in zip(rows, results[2 * n:]):
        assert [(s.reward, s.done) for s in steps] == [(0.0, False), (0.0, False), (0.0, True)]
        assert steps[-1].observation == f"Out of attempts; it was {row['answer']}."
        assert steps[-1].info == {"attempts": 3, "answer": "-1000"}
    assert runner.stats.errors == 0 and runner.stats.timeouts == 0


def test_env_kwargs_and_bad_rows_fail_with_a_message():
    env = make_env(ENV, {"max_attempts": 1})
    env.reset({"prompt": "What is 2 * 3?", "answer": "6", "seed": 0})
    assert check_step(env.step("5")) == ("Out of attempts; it was 6.", 0.0, True, {"attempts": 1, "answer": "5"})
    with pytest.raises(ValueError, match="env.name.*cannot build it with env.kwargs"):
        make_env(ENV, {"max_tries": 3})
    with pytest.raises(ValueError, match="max_attempts >= 1"):
        make_env(ENV, {"max_attempts": 0})
    with pytest.raises(ValueError, match="'prompt' and 'answer'"):
        env.reset({"seed": 3})


def test_reward_resolves_from_the_config_by_dotted_path():
    from docs.examples.my_reward import number_at_end

    cfg = load_config(ROOT / "configs/grpo_arith_cpu.yaml", [REWARD_OVERRIDE])  # validation resolves each name
    assert [(f.name, f.weight) for f in cfg.reward.functions] == [("accuracy", 1.0), (REWARD, 0.2)]
    assert resolve_reward_fn(REWARD) is number_at_end
    assert resolve_reward_fn("docs.examples.my_reward.number_at_end") is number_at_end
    with pytest.raises(ConfigError, match=r"reward.functions\[0\].name: cannot resolve"):
        load_config(ROOT / "configs/grpo_arith_cpu.yaml", ["reward.functions=[docs.examples.my_reward:nope]"])


def test_reward_scores_real_rows_directly_and_in_the_scorer_workers():
    cfg = load_config(ROOT / "configs/grpo_arith_cpu.yaml", [REWARD_OVERRIDE])
    rows = _rows(cfg, k=2)
    a0, a1 = rows[0]["answer"], rows[1]["answer"]
    completions = [f"The answer is {a0}.", f"{a0} is the answer", f"{int(a0) + 1}", f"so it is {a1}",
                   "no number here", f"{a1} . "]
    answers = [a0, a0, a0, a1, a1, a1]
    group_ids = [0, 0, 0, 1, 1, 1]
    fn = resolve_reward_fn(REWARD)
    expected = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert fn(completions, answers) == expected
    assert fn(["42.0", "-7"], ["42", "-7"]) == [1.0, 1.0] and fn(["ends with 5"], ["five"]) == [0.0]
    with pytest.raises(ValueError, match="2 completions and 1 answers"):
        fn(["1", "2"], ["1"])
    functions = [(f.name, f.weight) for f in cfg.reward.functions]
    with RewardScorer(functions, timeout_s=cfg.reward.timeout_s, num_workers=1) as scorer:
        result = scorer.score(completions, answers, group_ids)
    assert result.per_function[REWARD] == expected
    assert result.per_function["accuracy"] == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert result.rewards == pytest.approx([1.2, 1.0, 0.0, 1.2, 0.0, 1.2])
    assert result.metrics[f"reward/{REWARD}_mean"] == pytest.approx(0.5)
    assert result.metrics["reward/errors"] == 0.0 and result.metrics["reward/timeouts"] == 0.0
