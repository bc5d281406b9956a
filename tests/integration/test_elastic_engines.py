"""Engines join and leave a running job (docs/elastic.md, docs/faults.md), on a per-engine strategy (delta)
and on the collective one (weight_sync.strategy=nccl: our gloo group on CPU), whose group is re-formed for each new
membership without restarting the trainer or the healthy engines.

- placement.elastic: an engine is added after step 1 (it joins at version 1, verified, before it samples) and
  retired after step 2, under gloo in a one-step-off run and (with a warm spare that takes rollout worker 0's place
  when it is killed in step 3) under delta in a synchronous one, in one run each; the decisions are scripted
  here (the rules are unit-tested in tests/unit/test_elastic.py).
- Lost engines under gloo, in the one-step-off run: rollout worker 1 is killed as step 2's generate call reaches it
  (replaced, the group re-formed, every engine synced; its groups reissued), rollout worker 0 as the weight load of
  that sync reaches it (the broadcast fails for the whole group: the lost engine is replaced, the group re-formed, the
  sync redone).
Every step trains whole groups, none twice; every engine holds the trainer's weights at the end.
"""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
import ray

import orchestrator.placement.elastic_pool as elastic_pool
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.elastic import PoolDecision
from orchestrator.runtime.faults import fault_hook
from orchestrator.weight_sync import compare_checksums
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{"trainer.total_steps": 3})
                       + [REWARD, "placement.rollout_per_worker=0.25", "memory.preflight=false", *extra])


class Recorded(GRPOController):
    """Records the groups each step trained on (group id -> samples)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.at, self.trained = 0, {}

    def step(self, step: int):
        self.at = step
        return super().step(step)

    def train(self, trajs, advantages, ref):
        self.trained[self.at] = Counter(t.group_id for t in trajs)
        return super().train(trajs, advantages, ref)


def _run(controller) -> list[dict]:
    """Run, check that every engine holds the trainer's final weights, shut down; the metrics rows."""
    try:
        result = controller.run()
        _, meta_ref = controller.actors.trainer.weights_for_sync.options(num_returns=2).remote("float32")
        want = ray.get(meta_ref)["groups"]
        for k, worker in enumerate(controller.actors.rollout):
            engine = ray.get(worker.checksums.remote())
            assert engine["version"] == controller.cfg.trainer.total_steps, f"rollout worker {k}"
            compare_checksums(want, engine["groups"], where=f"rollout worker {k}")
        controller.reforms = controller.job.syncer.reforms
        controller.groups = (len(controller.actors.plan.groups), len(controller.actors.pgs))
        spares = controller.job.spares
        controller.taken, controller.worker0 = (spares.taken if spares else 0), controller.actors.rollout[0]
        controller.spare_now = spares.handles[0] if spares else None
    finally:
        controller.shutdown()
    return [json.loads(line) for line in open(result.metrics)]


def _whole_groups(controller) -> None:
    for step, groups in controller.trained.items():  # prompts_per_step = 2 groups of n = 4: none lost or twice
        assert sorted(groups) == [2 * step, 2 * step + 1] and set(groups.values()) == {4}, step


class JoinLeaveKill(Recorded):
    """Scripted decisions (an engine added after step 1, retired after step 2) and, with `kill_at`, rollout worker 0
    SIGKILLed as that step's generate call reaches it."""

    kill_at, killed = 0, False

    def kill(self, window, k, handle):
        if (self.at, window, k) == (self.kill_at, "generate", 0) and not self.killed:
            self.killed = True
            os.kill(ray.get(handle.pid.remote()), signal.SIGKILL)


def _scripted(monkeypatch) -> None:
    script = {1: "add", 2: "retire"}  # after step 1: a second engine; after step 2: back to one

    def scripted(rows, cfg, engines, room):
        action = script.get(rows[-1]["step"], "hold") if room else "hold"
        return PoolDecision(action, engines, f"placement.elastic: {action} (scripted)")

    monkeypatch.setattr(elastic_pool, "decide_pool", scripted)


def _assert_joined_and_left(rows, controller, trained_from_two: int = 1) -> None:
    """`trained_from_two`: the row whose batch both engines generated (sync: step 2's; one_step_off: step 3's, the
    batch generated during step 2)."""
    assert [r["engines/active"] for r in rows] == [1, 2, 1]  # step 2 ran on both engines
    assert [r.get("elastic/added") for r in rows] == [1, 0, None] and rows[1]["elastic/retired"] == 1
    assert ["rollout/worker1_tokens_per_s" in r for r in rows] == [k == trained_from_two for k in range(3)]
    assert [r["sync/version"] for r in rows] == [1, 2, 3]
    _whole_groups(controller)


def test_engines_join_are_lost_and_leave_the_re_formed_gloo_group_in_a_one_step_off_run(ray_local, tiny_model,
                                                                                         tmp_path, monkeypatch):
    """rollout.mode=one_step_off: the next step's batch is generated beside training and waited for before the weight
    sync, so nothing is in flight between steps. Batches 1 and 2 are generated in step 1 on one engine; an engine is
    added after step 1 (scripted) and generates batch 3 with the first one during step 2, where rollout worker 1 is
    killed as its generate call reaches it (replaced, the group re-formed, every engine synced; its group reissued)
    and rollout worker 0 as step 2's first weight load reaches it, the sync of that re-formed group (the broadcast
    fails for the whole group and the healthy engine fails at once instead of waiting out the group's timeout: the
    lost engine is replaced, the group re-formed, the sync redone). The second engine leaves after step 2, batch 3
    already returned."""
    class KillTwo(JoinLeaveKill):
        schedule = {(2, "generate"): 1, (2, "load"): 0}  # (step, window) -> the worker killed there

        def kill(self, window, k, handle):
            if self.schedule.get((self.at, window)) == k:
                del self.schedule[self.at, window]
                os.kill(ray.get(handle.pid.remote()), signal.SIGKILL)

    _scripted(monkeypatch)
    cfg = _cfg(tiny_model, tmp_path, "weight_sync.strategy=nccl", "placement.elastic=true", "rollout.max_workers=2",
               "sizing.warmup_steps=1", "rollout.mode=one_step_off", "algo.max_staleness=1", "run.max_restarts=2")
    controller = KillTwo(cfg)
    with fault_hook(controller.kill):
        rows = _run(controller)
    assert controller.schedule == {}  # both kills happened
    _assert_joined_and_left(rows, controller, trained_from_two=2)
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    # worker 1's loss is reported with the batch it generated (batch 3, trained in step 3); worker 0 died in the
    # weight load that followed its replacement (the re-formed group's sync of every engine), reported with step 2's
    # sync; then the group was re-formed again and the load redone
    assert [r["rollout/worker_restarts"] for r in rows] == [0, 0, 1]
    assert [r["rollout/groups_reissued"] for r in rows] == [0, 0, 1]  # worker 1's group of batch 3
    assert [r["sync/engine_restarts"] for r in rows] == [0, 1, 0] and rows[-1]["faults/restarts_total"] == 2
    # set up; joined; worker 1's replacement; worker 0's; worker 1's connection redone after it (with the sync); left
    assert controller.reforms == 6
    assert controller.groups == (2, 2)  # the job's + engine 0's: the retired engine's group was removed


def test_an_engine_joins_and_leaves_and_a_warm_spare_takes_a_lost_engines_place(ray_local, tiny_model, tmp_path,
                                                                                 monkeypatch):
    """delta (a strategy that keeps each engine's version: a joined, moved or spare engine holds none and gets the full
    weights), placement.elastic and rollout.spare_workers=1 in one run: an engine joins after step 1 and leaves
    after step 2; rollout worker 0 is killed in step 3's generate call and the spare started with the job takes its
    place (synced and verified before it samples); a new spare starts in the lost engine's slot after the step.
    (object_store: the same paths, tests/integration/test_rollout_node_loss.py and test_placement_modes.py.)"""
    _scripted(monkeypatch)
    cfg = _cfg(tiny_model, tmp_path, "placement.elastic=true", "rollout.max_workers=2", "sizing.warmup_steps=1",
               "rollout.spare_workers=1", "weight_sync.strategy=delta", "weight_sync.delta.max_changed_fraction=1.0")
    controller = JoinLeaveKill(cfg)
    controller.kill_at = 3
    controller.job.start()
    spare = controller.job.spares.handles[0]
    ray.get(controller.job.spares.readies)  # warm before the run: the test measures the swap, not the start
    controller.job.start = lambda resume_from=None: None  # run() on the job started above
    with fault_hook(controller.kill):
        rows = _run(controller)
    _assert_joined_and_left(rows, controller)
    assert controller.killed and [r["engines/spare"] for r in rows] == [1, 1, 0]  # the new one still starting
    assert [r["rollout/worker_restarts"] for r in rows] == [0, 0, 1] and rows[2]["rollout/groups_reissued"] == 2
    assert controller.taken == 1 and controller.worker0 == spare  # the spare is worker 0 now
    assert controller.spare_now is not None and controller.spare_now != spare  # a new spare, started after step 3
    assert controller.groups == (3, 3)  # the job's, engine 0's (the spare's before), the new spare's (engine 0's)
    # delta (every change sent as one: an Adam step moves nearly every element): step 1 full (no base yet); step 2 a
    # delta to both, the joined engine included (synced in full to version 1 when it joined); step 3 a delta to the
    # spare (synced in full to version 2 when it took worker 0's place)
    assert [r["sync/delta_engines"] for r in rows] == [0, 2, 1]
