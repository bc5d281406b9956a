"""The issue-17 probe "every reward call times out" on a real run (Ray local, CPU, tiny model): the run stops
at the first step, as it does when every call raises, with an error naming the function, the counts by kind and
what to do, instead of training on all-zero rewards.
"""
from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.reward import TooManyFailuresError
from tests.integration.conftest import run_error, tiny_overrides

pytestmark = pytest.mark.integration
HANG = "tests.unit.reward_helpers:hang"


def test_every_reward_call_timing_out_stops_the_run(ray_local, tiny_model, tmp_path):
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + [
        f"reward.functions=[{{name: '{HANG}', weight: 1.0}}]", "reward.timeout_s=1"])
    error, controller = run_error(cfg, TooManyFailuresError)
    message = str(error)
    for text in ("step 1: 2 of 2 reward function calls", f"'{HANG}': 2 timeouts",
                 "raise reward.timeout_s (now 1 s)", "reward.max_failed_frac=0.5"):
        assert text in message, (text, message)
    assert controller.rows() == []  # no step trained on the all-zero rewards
