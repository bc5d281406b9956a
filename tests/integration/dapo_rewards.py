"""A reward for the dynamic-sampling integration test (tests/integration/test_dynamic_sampling_run.py): light to import
in the scorer processes."""


def parity_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 for every sample of a prompt with an even answer (a uniform group); else (length mod 7) / 7."""
    return [1.0 if int(a) % 2 == 0 else (len(c) % 7) / 7.0 for c, a in zip(completions, answers)]
