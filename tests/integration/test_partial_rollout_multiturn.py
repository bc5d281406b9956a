"""Streamed multi-turn episodes (rollout.mode=stream with env.name, actors/rollout/stream_episodes.py) on
the real vLLM engine: a group's episodes run their agent loop on the worker, each turn a request on the streaming
engine; a weight sync lands mid-episode, interrupts the turns in flight, and every episode comes back exactly once
with a version per sampled token (non-decreasing, some episodes spanning both versions) while observation tokens
carry none (-1, logprob 0, masked). Then a short fully asynchronous multi-turn run on CPU, its environments in an env
actor (env.placement=actor) whose first reset of every group fails, completes with async/*, stream/* and env/*, trains
the other episodes of each group and counts the failures per batch.

    .venv/bin/python -m pytest tests/integration/test_partial_rollout_multiturn.py -q
"""
from __future__ import annotations

import json

import pytest
import ray

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides
from tests.integration.test_partial_rollout import _write_version

pytestmark = pytest.mark.integration
ENV = ["env.name=tests.integration.multiturn_envs:ChattyEnv", "env.kwargs={fail_every: 0}", "env.max_turns=2",
       "env.max_tokens=400", "env.step_timeout_s=20"]
TOKENS, N = 120, 4


@ray.remote(num_cpus=1)
class _Worker:
    def run(self, model: str, folder: str) -> dict:
        import time

        from actors.rollout.worker import RolloutWorker
        from orchestrator.rollout.multi_turn_source import check_env
        from orchestrator.rollout.types import PromptRequest

        cfg = load_config(None, ["rollout.kv_cache_space_gib=1", "rollout.ignore_eos=true", f"rollout.n={N}",
                                 f"rollout.max_new_tokens={TOKENS}", *ENV])
        worker = RolloutWorker(model, cfg.rollout)
        worker.stream_submit([PromptRequest(0, [], "", prompt="", seed=3)], check_env(cfg), 0)
        while worker.stream_drain(0.05)[1]["stream/running"] == 0:
            pass
        time.sleep(0.1)  # some tokens of the first turns sampled by version 0
        checks = worker.weight_sync("disk", "load", folder, 1)  # the stream is paused, loads, continues
        samples, metrics, deadline = [], {}, time.monotonic() + 60
        while len(samples) < N and time.monotonic() < deadline:
            got, metrics = worker.stream_drain(1.0)
            samples += got
        time.sleep(0.2)
        extra, _ = worker.stream_drain(0.0)  # nothing comes back twice
        worker.episodes.close()
        worker.stream.close()
        return {"version": checks["version"], "metrics": metrics, "extra": len(extra),
                "samples": [(s.key, s.first_version, s.to_trajectory()) for s in samples]}


def test_a_weight_sync_mid_episode_interrupts_its_turns_and_every_episode_returns_once(ray_local, tiny_model,
                                                                                       tmp_path):
    out = ray.get(_Worker.remote().run.remote(str(tiny_model), _write_version(tiny_model, tmp_path, 1, 1.5)))
    assert out["version"] == 1 and out["extra"] == 0
    assert out["metrics"]["stream/interruptions"] >= 1 and out["metrics"]["stream/running"] == 0
    assert sorted(k for k, *_ in out["samples"]) == [f"0:{i}" for i in range(N)]  # every episode once
    spanning = 0
    for _, first, t in out["samples"]:
        mask, versions = t.multiturn.loss_mask, t.token_versions
        assert len(versions) == len(mask) == len(t.response_ids) == len(t.logprobs) and t.multiturn.num_turns >= 1
        sampled = [v for v, m in zip(versions, mask) if m]
        assert all(v == -1 for v, m in zip(versions, mask) if not m) and 0 in mask  # observations: no version
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, mask) if not m)
        assert all(lp < 0.0 for lp, m in zip(t.logprobs, mask) if m)
        assert set(sampled) <= {0, 1} and sampled == sorted(sampled)  # non-decreasing over the episode
        assert first == t.weight_version == sampled[0] and sum(mask) == TOKENS * t.multiturn.num_turns
        spanning += len(set(sampled)) == 2
    assert spanning >= 1  # the sync landed inside episodes: their later tokens are version 1's


def _async_run(tiny_model, tmp_path, extra: list) -> tuple[list, object]:
    """A 2-step fully asynchronous multi-turn run (k = 1) of ChattyEnv; its rows and config."""
    cfg = load_config("configs/grpo_guessing_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + ENV + [
        "rollout.mode=stream", "algo.max_staleness=1",
        "trainer.total_steps=2", "rollout.max_new_tokens=8", "checkpoint.every_steps=0", *extra])
    controller = GRPOController(cfg)
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2] and [r["sync/version"] for r in rows] == [1, 2]
    return rows, cfg


def test_streamed_episodes_in_env_actors_count_failed_resets_per_batch(ray_local, tiny_model, tmp_path):
    """A fully asynchronous multi-turn run (rollout.mode=stream, k = 1) completes with async/*, stream/* and env/*
    metrics, with env.placement=actor: the episodes' envs live in one env actor, and the first reset of every
    group fails there (ChattyEnv fail_first_reset): each group completes with n - 1 trained episodes, and every
    batch's row counts its failures (env/reset_failures, env/errors, env/failed_frac = 1 / n, under the default
    env.max_failed_frac 0.5) with no env actor replaced. (Streamed episodes with env.placement=thread: the test
    above, on the worker; before, a run of their own.)"""
    rows, cfg = _async_run(tiny_model, tmp_path, ["env.kwargs={fail_every: 0, fail_first_reset: true}",
                                                  "env.placement=actor", "env.num_actors=1", "env.actor_cpus=0.1"])
    groups, n = cfg.rollout.prompts_per_step, cfg.rollout.n
    for r in rows:
        assert r["env/episodes"] == groups * n and r["env/reset_failures"] == r["env/errors"] == groups
        assert r["env/failed_frac"] == 1 / n and r["env/actor_restarts"] == 0 and r["env/step_s"] > 0
        assert r["rollout/trajectories"] == groups * (n - 1) == sum(r[f"async/staleness_{s}"] for s in (0, 1))
        assert 1.0 <= r["rollout/turns_mean"] <= 2.0 and "reward/mean" in r  # multi-turn episodes were trained
        assert r["async/staleness_max"] <= 1 and "stream/interruptions" in r and r["async/trainer_wait_s"] >= 0
