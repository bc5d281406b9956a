"""Two GRPO steps of data.source=reasoning_gym:basic_arithmetic on Ray (local, CPU) and vLLM with the tiny model
(configs/grpo_reasoning_gym_cpu.yaml): the rows are the task's questions, the reward `reasoning_gym` (the task's own
scorer, in the reward actor's worker processes) is logged every step with no failed call, and every sampled
completion's logged reward is what the task's scorer gives it here."""
from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.reward.rgym import reasoning_gym_reward
from tests.integration.conftest import run_rows, tiny_overrides

pytestmark = pytest.mark.integration


def test_two_steps_on_a_reasoning_gym_task_log_its_reward(ray_local, tiny_model, tmp_path):
    over = tiny_overrides(tiny_model, tmp_path, **{"eval.holdout": 0, "metrics.samples_every": 1,
                                                   "metrics.samples_n": 8, "data.reasoning_gym.answer_format": "last_line",
                                                   "checkpoint.every_steps": 0})
    cfg = load_config("configs/grpo_reasoning_gym_cpu.yaml", over)
    rows = run_rows(cfg)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.0 <= r["reward/reasoning_gym_mean"] <= 1.0
        assert r["reward/mean"] == pytest.approx(r["reward/reasoning_gym_mean"])
        assert r["reward/errors"] == 0 and r["reward/timeouts"] == 0 and r["reward/failed_frac"] == 0
    samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert len(samples) == 16
    for s in samples:
        ref = json.loads(s["answer"])
        assert ref["reasoning_gym"] == "basic_arithmetic" and "Calculate" in s["prompt"]
        assert s["rewards"]["reasoning_gym"] == pytest.approx(reasoning_gym_reward([s["completion"]], [s["answer"]])[0])
