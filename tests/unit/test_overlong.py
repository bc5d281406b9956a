"""DAPO overlong reward shaping (eq. 13) and overlong filtering (orchestrator/reward/overlong.py): hand values."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from orchestrator.config import ConfigError, load_config
from orchestrator.reward.overlong import (add_overlong_penalty, is_truncated, overlong_filter_masks,
                                          overlong_filter_metrics, overlong_penalty)
from orchestrator.rollout import Trajectory
from orchestrator.rollout.types import MultiTurnInfo

YAML = "configs/grpo_arith_cpu.yaml"


def traj(length: int, finish: str = "stop", multiturn=None) -> Trajectory:
    return Trajectory(0, [1], [5] * length, [0.0] * length, finish, multiturn=multiturn)


def test_eq_13_hand_values() -> None:
    # L_max = 20, L_cache = 5: 0 up to 15 tokens, (15 - |y|) / 5 on (15, 20], -1 beyond
    assert [overlong_penalty(n, 20, 5) for n in (0, 15, 16, 18, 20, 21, 99)] == [0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0]
    assert overlong_penalty(8, 8, 8) == -1.0 and overlong_penalty(0, 8, 8) == 0.0
    with pytest.raises(ValueError, match="cache_len <= max_len"):
        overlong_penalty(3, 4, 5)


def test_the_penalty_is_added_with_its_factor_and_logged() -> None:
    cfg = OmegaConf.create({"reward": {"overlong_penalty": {"enabled": True, "max_len": 0, "cache_len": 4,
                                                            "factor": 0.5}}, "rollout": {"max_new_tokens": 10}})
    row: dict = {}
    # max_len 0 = rollout.max_new_tokens = 10: lengths 6 -> 0, 8 -> -0.5 * 0.5, 10 -> -1 * 0.5
    out = add_overlong_penalty([1.0, 1.0, 0.0], [traj(6), traj(8), traj(10, "length")], cfg, row)
    assert out == [1.0, 0.75, -0.5]
    assert row == {"reward/overlong_penalty_mean": pytest.approx(-0.25), "reward/overlong_penalized_frac": pytest.approx(2 / 3)}
    off = OmegaConf.create({"reward": {"overlong_penalty": {"enabled": False}}})
    rewards, row = [1.0], {}
    assert add_overlong_penalty(rewards, [traj(99)], off, row) is rewards and row == {}


def filter_cfg(on: bool, mini_batches: int = 1):
    return OmegaConf.create({"algo": {"overlong_filter": on}, "trainer": {"mini_batches": mini_batches}})


def test_truncated_samples_leave_the_loss() -> None:
    trajs = [traj(2), traj(3, "length"), traj(1), traj(2, "length")]
    assert overlong_filter_masks(trajs, None, filter_cfg(True)) == [[1, 1], [0, 0, 0], [1], [0, 0]]
    assert overlong_filter_metrics(trajs, filter_cfg(True)) == {"rollout/overlong_filtered_frac": 0.5,
                                                                "rollout/overlong_unfiltered": 0}
    assert overlong_filter_masks(trajs, None, filter_cfg(False)) is None
    assert overlong_filter_metrics(trajs, filter_cfg(False)) == {}
    # multi-turn: its own loss mask is kept, and truncation is its stop reason
    done = MultiTurnInfo([1, 0, 1], [1.0], 1, "done")
    cut = MultiTurnInfo([1, 0], [0.0], 2, "max_turns")
    mt = [traj(3, "stop", done), traj(2, "length", cut)]
    assert [is_truncated(t) for t in mt] == [False, True]
    assert overlong_filter_masks(mt, [[1, 0, 1], [1, 0]], filter_cfg(True)) == [[1, 0, 1], [0, 0]]


def test_a_mini_batch_of_only_truncated_samples_stays_in_the_loss() -> None:
    # 2 mini-batches of 2 rows: the second holds only truncated samples (the loss would have no token)
    trajs = [traj(2, "length"), traj(2), traj(1, "length"), traj(3, "length")]
    assert overlong_filter_masks(trajs, None, filter_cfg(True, 2)) == [[0, 0], [1, 1], [1], [1, 1, 1]]
    assert overlong_filter_metrics(trajs, filter_cfg(True, 2)) == {"rollout/overlong_filtered_frac": 0.25,
                                                                   "rollout/overlong_unfiltered": 2}


def test_config_keys_and_checks() -> None:
    c = load_config(YAML, ["reward.overlong_penalty.enabled=true", "reward.overlong_penalty.cache_len=8",
                           "algo.overlong_filter=true"])
    assert c.reward.overlong_penalty.max_len == 0 and c.algo.overlong_filter
    with pytest.raises(ConfigError, match=r"reward.overlong_penalty.cache_len=100 exceeds its max_len \(48"):
        load_config(YAML, ["reward.overlong_penalty.enabled=true", "reward.overlong_penalty.cache_len=100"])
    with pytest.raises(ConfigError, match="reward.overlong_penalty.factor"):
        load_config(YAML, ["reward.overlong_penalty.factor=-1"])
