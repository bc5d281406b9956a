"""Two multi-turn GRPO steps of a Gymnasium game (configs/grpo_frozenlake_cpu.yaml: env.name=gymnasium:FrozenLake-v1)
on Ray (local, CPU) and vLLM with the tiny model, the game in an env actor (env.placement=actor, its bundle in the
job's placement group): the episodes run several turns against the real game with no env error and no actor
restart, the board reaches the policy as text, and the step rows carry the multi-turn metrics. (Thread placement
is run by test_multiturn_grpo.py and test_async_grpo.py.)"""
from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from tests.integration.conftest import run_rows, tiny_overrides

pytestmark = pytest.mark.integration


def test_two_steps_of_frozen_lake(ray_local, tiny_model, tmp_path):
    over = tiny_overrides(tiny_model, tmp_path, **{"env.max_turns": 3, "env.max_tokens": 320,
                                                   "rollout.max_new_tokens": 8, "metrics.samples_every": 1,
                                                   "metrics.samples_n": 4, "checkpoint.every_steps": 0,
                                                   "env.placement": "actor", "env.num_actors": 1, "env.actor_cpus": 0.1})
    cfg = load_config("configs/grpo_frozenlake_cpu.yaml", over)
    rows = run_rows(cfg)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["env/errors"] == 0 and r["env/reset_failures"] == 0 and r["env/actor_restarts"] == 0
        assert r["rollout/turns_mean"] > 1 and 0.0 <= r["reward/mean"] <= 1.0
    samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert len(samples) == 8  # 4 per step
    for s in samples:  # the opening message is the intro and the board, the player at the start in brackets
        users = [t["content"] for t in s["turns"] if t["role"] == "user"]
        assert "You are playing FrozenLake-v1" in users[0] and "[S]FFF\nFHFH\nFFFH\nHFFG" in users[0]
        assert len(users) >= 2  # and the game answered at least one move
