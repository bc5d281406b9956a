"""Two controller steps each with the issue-19 losses (Ray local, CPU, tiny model, vLLM on CPU): GSPO with the
entropy bonus, and CISPO. The trainer actor resolves the built-in names, trains, and every row carries the
metrics every loss reports (entropy, clip fractions by side, dual-clip fraction, approximate KL to the old policy)."""
from __future__ import annotations

import math

import pytest

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"
KEYS = ("actor/entropy", "actor/clip_frac", "actor/clip_frac_low", "actor/clip_frac_high", "actor/clip_frac_dual",
        "actor/approx_kl_old", "actor/loss", "actor/grad_norm")


@pytest.mark.parametrize("extra", [["algo.policy_loss=gspo", "algo.entropy_coef=0.01"],
                                   ["algo.policy_loss=cispo", "trainer.mini_batches=2"]],
                         ids=["gspo-entropy", "cispo-2-mini-batches"])
def test_two_steps_with_a_new_loss(ray_local, tiny_model, tmp_path, extra):
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + [REWARD, *extra])
    controller = GRPOController(cfg)
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    assert [r["step"] for r in result.rows] == [1, 2]
    for row in result.rows:
        for key in KEYS:
            assert key in row and math.isfinite(row[key]), key
        assert 0 < row["actor/entropy"] and row["actor/grad_norm"] > 0
        assert row["actor/clip_frac_low"] + row["actor/clip_frac_high"] == pytest.approx(row["actor/clip_frac"])
    if "trainer.mini_batches=2" in extra:  # the second mini-batch sees a moved policy
        assert any(r["actor/approx_kl_old"] > 0 for r in result.rows)
