"""Fully asynchronous GRPO with partial rollouts (rollout.mode=stream) on Ray (local, CPU), tiny model:
the engine streams while the trainer trains, groups started up to k versions back are trained, every trained
sample is within algo.max_staleness, the verified sync (and its probe) passes every step while the engine
streams, a resume continues with the checkpoint's untrained groups, and rewards and reference logprobs scored per
group as the groups complete (algo.kl_coef > 0 in the first run) reach the trainer in trajectory order. DAPO dynamic
sampling runs in it (a reward that makes the groups of even answers uniform): a step takes the groups it is missing
from the stream and trains only informative groups while there are enough. Whether a
sync lands inside a generation depends on timing here (the tiny model generates faster than it trains);
tests/integration/test_partial_rollout.py interrupts generations deterministically, on the engine and through the
worker's weight sync. The first run is elastic (docs/elastic.md): a second engine joins the stream after step 1 and
leaves after step 2 (scripted decisions), its groups still in flight started again on the first engine, and every
count above (samples taken, tokens, staleness) holds through both changes.

    .venv/bin/python -m pytest tests/integration/test_partial_rollout_run.py -q
"""
from __future__ import annotations

import json

import pytest

import orchestrator.placement.elastic_pool as elastic_pool
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.elastic import PoolDecision
from tests.integration.conftest import assert_engine_holds_trainer_weights, tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.dapo_rewards:parity_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{"rollout.max_new_tokens": 32}) + [
        REWARD, "rollout.mode=stream", "algo.max_staleness=2", "algo.dynamic_sampling.enabled=true",
        "algo.dynamic_sampling.max_rounds=2",
        "rollout.ignore_eos=true", "checkpoint.every_steps=2", *extra])


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_streaming_run_trains_within_the_bound_and_resumes(ray_local, tiny_model, tmp_path, monkeypatch):
    script = {1: "add", 2: "retire"}
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: PoolDecision(
        script.get(rows[-1]["step"], "hold"), engines, "placement.elastic: (scripted)"))
    cfg = _cfg(tiny_model, tmp_path, "trainer.total_steps=4", "algo.kl_coef=0.05",  # a reference, scored per group
               "placement.elastic=true", "rollout.max_workers=2", "sizing.warmup_steps=1")
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        assert_engine_holds_trainer_weights(controller, 4)
        state = json.loads((tmp_path / "ckpt" / "step_000004" / "state.json").read_text())
    finally:
        controller.shutdown()
    rows = _rows(result.metrics)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["sync/version"] for r in rows] == [1, 2, 3, 4]
    assert [r["engines/active"] for r in rows] == [1, 2, 1, 1]  # joined after step 1, left after step 2
    assert [r.get("elastic/added") for r in rows[:3]] == [1, 0, 0] and rows[1]["elastic/retired"] == 1
    assert all(r["async/staleness_max"] <= 2 for r in rows)
    taken = [r["rollout/dyn_groups_generated"] * cfg.rollout.n for r in rows]  # samples taken, every round
    assert [sum(r[f"async/staleness_{s}"] for s in range(3)) for r in rows] == taken
    # groups started versions back are trained (k = 2 batches ahead; dynamic sampling's rounds take them sooner)
    assert max(r["async/staleness_max"] for r in rows) >= 1
    assert [r["rollout/tokens"] for r in rows] == [32 * t for t in taken]  # ignore_eos: each ran its whole budget
    per_step = cfg.rollout.prompts_per_step
    for r in rows:  # dynamic sampling: each round takes the groups missing; the batch keeps its size
        assert r["rollout/dyn_groups_kept"] + r["rollout/dyn_groups_padded"] == per_step
        assert r["rollout/dyn_groups_generated"] <= per_step * r["rollout/dyn_rounds"]
        if r["rollout/dyn_groups_padded"] == 0:
            assert r["rollout/groups_mixed_frac"] == 1.0
    assert all(r["stream/score_wait_s"] >= 0 and "reward/mean" in r for r in rows)  # scored per group
    # step 1 trains the initial policy, which the reference is: ~0 only with each sample's own reference logprobs
    assert abs(rows[0]["actor/kl"]) < 1e-3 and max(abs(r["actor/kl"]) for r in rows) > 0
    untrained = state["async"]["requests"]  # started, not trained at the end: kept for a resume
    assert len(untrained) > 0 and state["async"]["batches_drawn"] >= 4

    resumed = GRPOController(_cfg(tiny_model, tmp_path, "trainer.total_steps=5",
                                  f"checkpoint.resume={tmp_path / 'ckpt' / 'step_000004'}"))
    try:
        resumed.run()
        assert_engine_holds_trainer_weights(resumed, 5)
    finally:
        resumed.shutdown()
    rows = _rows(result.metrics)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["async/staleness_max"] <= 2
    assert any(r["rollout/dyn_rounds"] > 1 for r in rows), [r["rollout/dyn_rounds"] for r in rows]
