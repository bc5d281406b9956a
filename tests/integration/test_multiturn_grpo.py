"""Multi-turn GRPO on Ray (local, CPU): rollout workers with vLLM, a user env by dotted path, 2 steps. The run is
elastic (docs/elastic.md): it starts with one engine and a second is added after step 1 (a scripted decision), so
step 2's groups are routed over both by the sticky router.

Checks: trajectories have several turns; every sample and turn of a group ran on one rollout worker;
the loss mask covers exactly the sampled ids (observation ids masked, logprob 0.0, one logprob per
trained id); the engine's sampled logprobs equal the trainer's on the trained ids after the verified
weight sync; an environment that raises ends only its episode (counted in env/errors); the multi-turn
metrics (turns, env step time, prefix-cache counters) are in every step's row.
"""
from __future__ import annotations

import json

import pytest
import ray

import orchestrator.placement.elastic_pool as elastic_pool
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.elastic import PoolDecision
from orchestrator.weight_sync import compare_checksums
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
ENV = ["env.name=tests.integration.multiturn_envs:ChattyEnv", "env.max_turns=3", "env.max_tokens=320",
       "rollout.num_workers=1", "rollout.block_size=32", "rollout.max_new_tokens=8", "env.step_timeout_s=20",
       "placement.elastic=true", "rollout.max_workers=2", "sizing.warmup_steps=1"]


class RecordingController(GRPOController):
    """Keeps every step's trajectories for the checks."""

    def train(self, trajs, advantages, ref):
        self.seen = getattr(self, "seen", []) + [trajs]
        return super().train(trajs, advantages, ref)


def test_multiturn_grpo_two_steps(ray_local, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: PoolDecision(
        "add" if room else "hold", engines, f"placement.elastic: {'add' if room else 'hold'} (scripted)"))
    cfg = load_config("configs/grpo_guessing_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + ENV)
    controller = RecordingController(cfg)
    try:
        result = controller.run()
        trainer, workers = controller.actors.trainer, controller.actors.rollout
        _, meta_ref = trainer.weights_for_sync.options(num_returns=2).remote("float32")
        for w in workers:  # every engine holds the trainer's weights (version 2) after the last sync
            engine = ray.get(w.checksums.remote())
            assert engine["version"] == 2
            compare_checksums(ray.get(meta_ref)["groups"], engine["groups"])
        # a fresh multi-turn rollout on the synced weights: the engine's logprobs of the trained ids are the
        # trainer's (aligned one to one), and the observation ids carry logprob 0.0
        fresh, _ = ray.get(workers[0].generate_multiturn.remote([{"group_id": 99, "sample": {"seed": 1}, "n": 2}],
                                                                 controller.source.env_cfg, 0))
        ours = ray.get(trainer.logprobs.remote([t.prompt_ids for t in fresh], [t.response_ids for t in fresh]))
        for t, lp in zip(fresh, ours):
            mask = t.multiturn.loss_mask
            gaps = [abs(a - b) for a, b, m in zip(t.logprobs, lp, mask) if m]
            assert len(gaps) == sum(mask) and max(gaps) < 2e-3
    finally:
        controller.shutdown()

    trajs = [t for step in controller.seen for t in step]
    assert len(controller.seen) == 2
    by_group: dict = {}
    for t in trajs:
        by_group.setdefault(t.group_id, set()).add(t.multiturn.rollout_worker)
        mask, n = t.multiturn.loss_mask, len(t.response_ids)
        assert len(mask) == n == len(t.logprobs)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, mask) if not m)
        assert all(lp < 0.0 for lp, m in zip(t.logprobs, mask) if m)
        # observation ids sit between sampled turns: as many masked runs as turns - 1
        runs = sum(1 for k in range(1, n) if mask[k] == 0 and mask[k - 1] == 1)
        assert runs == t.multiturn.num_turns - 1
        assert t.multiturn.reward == pytest.approx(sum(t.multiturn.turn_rewards))
    assert all(len(workers_of_group) == 1 for workers_of_group in by_group.values())  # sticky
    assert [{t.multiturn.rollout_worker for t in step} for step in controller.seen] == [{0}, {0, 1}]  # the added one
    assert max(t.multiturn.num_turns for t in trajs) == 3 and min(t.multiturn.num_turns for t in trajs) >= 1
    errors = [t for t in trajs if t.multiturn.stop_reason == "env_error"]
    assert errors and all("injected failure" in t.multiturn.env_error for t in errors)
    assert len(errors) < len(trajs)

    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["sync/version"] == 2
    assert [r["engines/active"] for r in rows] == [1, 2] and rows[0]["elastic/added"] == 1
    for key in ("rollout/turns_mean", "env/step_s", "env/errors", "rollout/truncated_frac", "reward/mean",
                "rollout/prefix_cache_hit_rate", "rollout/prefill_tokens_requested", "rollout/prefill_tokens_computed",
                "actor/grad_norm", "timing/generate_s"):
        assert all(key in r for r in rows), key
    assert sum(r["env/errors"] for r in rows) == len(errors)
    for r in rows:  # failed episodes / episodes (2 groups x n=4); below env.max_failed_frac, so the run went on
        assert r["env/failed_frac"] == pytest.approx(r["env/errors"] / 8) and r["env/failed_frac"] <= 0.5
    for r in rows:
        assert 1.0 <= r["rollout/turns_mean"] <= 3.0
        assert 0 < r["rollout/prefill_tokens_computed"] < r["rollout/prefill_tokens_requested"]  # prefix cache hits
        assert r["rollout/in_flight_max"] >= 2  # continuous batching: many turns in flight, not one at a time
