"""Reward functions for integration tests on a random tiny model (accuracy would always be 0 there)."""


def length_reward(completions: list[str], answers: list[str]) -> list[float]:
    """A varying, deterministic reward: the completion's length in characters, modulo 7, over 7."""
    return [(len(c) % 7) / 7.0 for c in completions]
