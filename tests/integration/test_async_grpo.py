"""placement.mode=disaggregated_async on Ray (local, CPU) with a tiny random model and vLLM on CPU.

Three one-step-off steps: every batch's staleness within algo.max_staleness (0 on step 1, then 1), the
verified weight sync passes every step, engines and trainer agree at the end, a wrong weight version is
still caught, and a resume regenerates the batch that was in flight at the checkpoint. Multi-turn rollouts
(the guessing environment) run in the same pipeline: the async pipeline wraps any rollout source.
"""
from __future__ import annotations

import json
import shutil

import pytest
import ray

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.rollout import PromptRequest
from orchestrator.weight_sync import WeightMismatchError
from tests.integration.conftest import assert_engine_holds_trainer_weights, tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [
        REWARD, "placement.mode=disaggregated_async", "trainer.total_steps=3", "checkpoint.every_steps=1", *extra])


def test_async_staleness_never_exceeds_its_bound(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path)
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        # engines and trainer agree at the end: version 3 and equal checksums; 3 optimizer steps
        trainer, worker = assert_engine_holds_trainer_weights(controller, 3)
        assert ray.get(trainer.get_step.remote()) == 3
        # the version check still catches a batch of a version other than the expected one
        req = PromptRequest(group_id=0, prompt_ids=[1, 2, 3, 4, 5], answer="")
        launched = controller.source.launch([req])
        assert controller.source.collect(launched, 3, {})[0].weight_version == 3
        with pytest.raises(WeightMismatchError, match="version 3, expected 2"):
            controller.source.collect(launched, 2, {})
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert [r["async/weight_version"] for r in rows] == [0, 0, 1]
    assert [r["rollout/queue_depth"] for r in rows] == [1, 1, 0]  # the next batch in flight, none past the end
    assert all(r["async/staleness"] <= cfg.algo.max_staleness for r in rows)
    assert rows[-1]["async/max_staleness_seen"] == 1 and rows[-1]["async/dropped_batches"] == 0
    assert [r["sync/version"] for r in rows] == [1, 2, 3]  # the verified sync ran (and passed) every step
    # steps 1 and 2 ran the next batch's generation; step 3 launched nothing past trainer.total_steps
    assert all(r["async/overlap_s"] >= 0 for r in rows) and rows[-1]["async/overlap_s"] == 0
    assert rows[-1]["roles/rollout_busy_s"] < rows[0]["roles/rollout_busy_s"]
    assert all(r["actor/tis_weight_mean"] > 0 for r in rows)
    # a checkpoint stores the loader before the pending batch's prompts: the same positions as a sync run
    per_step = cfg.rollout.prompts_per_step
    positions = [json.loads((tmp_path / "ckpt" / f"step_{s:06d}" / "state.json").read_text())["loader"]["position"]
                 for s in (2, 3) if (tmp_path / "ckpt" / f"step_{s:06d}").exists()]
    assert positions == [2 * per_step, 3 * per_step][-len(positions):] and positions


def test_resume_regenerates_the_batch_in_flight_at_the_checkpoint(ray_local, tiny_model, tmp_path):
    first = GRPOController(_cfg(tiny_model, tmp_path, "checkpoint.keep_last=3"))
    try:
        first.run()
        final_loader = first.loader.state_dict()
    finally:
        first.shutdown()
    shutil.rmtree(tmp_path / "ckpt" / "step_000003")  # as if the run stopped after step 2 (batch 3 in flight)
    second = GRPOController(_cfg(tiny_model, tmp_path, "checkpoint.resume=latest"))
    try:
        result = second.run()
        assert ray.get(second.actors.trainer.get_step.remote()) == 3
    finally:
        second.shutdown()
    assert second.start_step == 2
    row = result.rows[-1]
    assert row["step"] == 3 and row["async/staleness"] == 0 and row["async/weight_version"] == 2
    assert second.loader.state_dict() == final_loader  # the same prompts were sampled again for step 3


def test_async_multi_turn_guessing_game(ray_local, tiny_model, tmp_path):
    """placement.mode=disaggregated_async with env.name=guessing: episodes of the next step play while the
    trainer trains; staleness within its bound, the verified sync every step, sticky groups, env rewards."""
    cfg = load_config("configs/grpo_guessing_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + [
        "placement.mode=disaggregated_async", "algo.tis_cap=2.0", "trainer.total_steps=3", "rollout.num_workers=2",
        "rollout.max_new_tokens=8", "env.max_turns=3", "env.max_tokens=320", "checkpoint.every_steps=0"])
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        trainer, _ = assert_engine_holds_trainer_weights(controller, 3)
        assert ray.get(trainer.get_step.remote()) == 3
        placed = controller.source.router.loads()
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert [r["sync/version"] for r in rows] == [1, 2, 3]
    assert all(1.0 <= r["rollout/turns_mean"] <= 3.0 for r in rows)  # multi-turn episodes, env metrics logged
    assert all("env/step_s" in r and "reward/mean" in r and r["router/groups_per_worker_max"] >= 1 for r in rows)
    assert all(r["actor/tis_weight_mean"] > 0 for r in rows)
    assert rows[0]["async/overlap_s"] >= 0 and rows[-1]["async/overlap_s"] == 0
    assert sum(placed.values()) == 0  # every routed group was released once its episodes returned
