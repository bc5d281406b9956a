"""env.name=gymnasium:<id> (orchestrator/envs/gymnasium_text.py): real Gymnasium games played as text through
the Environment protocol and the run's own env resolution and checks."""
from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.envs.env import check_step, make_env
from orchestrator.envs.gymnasium_text import ansi_to_text, parse_action

LAKE = {"make_kwargs": {"is_slippery": False}, "actions": ["left", "down", "right", "up"]}


def test_frozen_lake_played_to_the_goal_scores_1():
    env = make_env("gymnasium:FrozenLake-v1", LAKE)
    first = env.reset({"prompt": "", "answer": "", "seed": 7})
    assert "0 = left, 1 = down, 2 = right, 3 = up" in first and "[S]FFF\nFHFH\nFFFH\nHFFG" in first
    path = ["down", "I will go down.", "2", "down", "Right!", "right"]
    steps = [check_step(env.step(a)) for a in path]
    assert [s.reward for s in steps] == [0.0] * 5 + [1.0]
    assert [s.done for s in steps] == [False] * 5 + [True]
    assert steps[-1].observation.endswith("HFF[G]") and steps[2].info == {"action": 2, "truncated": False}


def test_a_hole_ends_the_episode_with_0_and_a_reply_without_action_goes_on():
    env = make_env("gymnasium:FrozenLake-v1", LAKE)
    env.reset({"seed": 0})
    bad = check_step(env.step("I am not sure"))
    assert bad.done is False and bad.reward == 0.0 and "not a valid action" in bad.observation
    assert check_step(env.step("right")).done is False
    hole = check_step(env.step("down"))  # (1, 1) is a hole
    assert hole.done is True and hole.reward == 0.0


def test_blackjack_without_ansi_shows_the_observation_and_is_seeded():
    a = make_env("gymnasium:Blackjack-v1", {"actions": ["stick", "hit"]})
    b = make_env("gymnasium:Blackjack-v1", {"actions": ["stick", "hit"]})
    assert a.reset({"seed": 5}) == b.reset({"seed": 5})  # a GRPO group shares its seed: the same deal
    step = check_step(a.step("stick"))
    assert step.done is True and step.reward in (-1.0, 0.0, 1.0, 1.5)


def test_parse_action_and_ansi_text():
    assert parse_action("go LEFT then up", 4, ["left", "down", "right", "up"]) == 3
    assert parse_action("action 3", 4, []) == 3 and parse_action("action 9", 4, []) is None
    assert parse_action("leftover", 4, ["left"]) is None and parse_action("", 2, []) is None
    assert ansi_to_text("\nS\x1b[41mF\x1b[0mF\n\x1b[1mH\x1b[0m\n") == "S[F]F\n[H]"


def test_errors_name_the_env():
    base = ["env.max_turns=4"]
    with pytest.raises(ConfigError, match="env.name='gymnasium:NoSuchGame-v0'.*NoSuchGame"):
        load_config(None, base + ["env.name=gymnasium:NoSuchGame-v0"])
    cfg = load_config(None, base + ["env.name=gymnasium:FrozenLake-v1", "env.kwargs={make_kwargs: {is_slippery: false}}"])
    assert cfg.env.name == "gymnasium:FrozenLake-v1"
    with pytest.raises(ValueError, match="not Discrete"):
        make_env("gymnasium:MountainCarContinuous-v0")
    # the config load builds one instance: a game the adapter cannot play and bad kwargs fail before any actor starts
    with pytest.raises(ConfigError, match="env.name='gymnasium:Pendulum-v1'.*not Discrete"):
        load_config(None, base + ["env.name=gymnasium:Pendulum-v1"])
    with pytest.raises(ConfigError, match="env.kwargs.actions=\\['a'\\]: FrozenLake-v1 has 4 actions"):
        load_config(None, base + ["env.name=gymnasium:FrozenLake-v1", "env.kwargs={actions: [a]}"])
    with pytest.raises(ValueError, match="env.kwargs.actions"):
        make_env("gymnasium:FrozenLake-v1", {"actions": ["a", "b"]})
    with pytest.raises(ValueError, match="gymnasium.make refuses it"):
        make_env("gymnasium:FrozenLake-v1", {"make_kwargs": {"no_such_arg": 1}})
