"""Nodes join and leave a running elastic job (docs/elastic.md), on several raylets on this machine
(ray.cluster_utils.Cluster) with the collective weight sync (weight_sync.strategy=nccl: our gloo group on CPU). The
head holds the reward actor; one node with one custom resource `slot` holds the trainer, one the first engine (every
bundle asks one `slot`).

A node joins before step 2: the cluster has room for one more engine's placement group, so after step 2 an engine is
added there (the decision is scripted to "add when there is room": the rules are unit-tested in
tests/unit/test_elastic.py); it joins the re-formed group at version 2, verified, and step 3 generates on both
engines. The node leaves as step 4's generate call reaches that engine (found there, or at the step's weight sync
when the generation had already returned): its group cannot be placed again, so the engine leaves the job (above rollout.min_workers) instead of stopping the run; its groups go to the first engine and
the group is re-formed without it. Every step trains its whole groups, none twice.
"""
from __future__ import annotations

import json
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


class JoinThenLeave(GRPOController):
    """Adds a `slot` node before step 2; removes it as step 4's generate call reaches rollout worker 1."""

    def __init__(self, cfg, cluster):
        super().__init__(cfg)
        self.cluster, self.node, self.at, self.trained, self.removed = cluster, None, 0, {}, False

    def step(self, step: int):
        self.at = step
        if step == 2:
            self.node = self.cluster.add_node(num_cpus=0, resources={"slot": 1})
            self.cluster.wait_for_nodes()
        return super().step(step)

    def train(self, trajs, advantages, ref):
        self.trained[self.at] = Counter(t.group_id for t in trajs)
        return super().train(trajs, advantages, ref)

    def remove(self, window: str, k: int, handle) -> None:
        if window == "generate" and self.at == 4 and k == 1 and not self.removed:
            self.removed = True
            self.cluster.remove_node(self.node, allow_graceful=False)


def test_an_engine_joins_on_a_new_node_and_leaves_with_it(cluster, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: PoolDecision(
        "add" if room else "hold", engines, f"placement.elastic: {'add' if room else 'hold'} (scripted: room={room})"))
    for _ in range(2):  # trainer, first engine
        cluster.add_node(num_cpus=0, resources={"slot": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path, **{"trainer.total_steps": 4})
                      + [REWARD, "placement.resource=slot", "placement.trainer_per_worker=1", "memory.preflight=false",
                         "placement.rollout_per_worker=1", "placement.timeout_s=5", "weight_sync.strategy=nccl",
                         "placement.elastic=true", "rollout.max_workers=2", "sizing.warmup_steps=1"])
    controller = JoinThenLeave(cfg, cluster)
    try:
        with fault_hook(controller.remove):
            result = controller.run()
        assert controller.removed and len(controller.actors.rollout) == 1
        _, meta_ref = controller.actors.trainer.weights_for_sync.options(num_returns=2).remote("float32")
        engine = ray.get(controller.actors.rollout[0].checksums.remote())
        assert engine["version"] == 4
        compare_checksums(ray.get(meta_ref)["groups"], engine["groups"])
        groups = len(controller.actors.plan.groups)
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["engines/active"] for r in rows] == [1, 1, 2, 1]  # step 4 ended with the engine gone
    assert [r.get("elastic/added") for r in rows[:3]] == [0, 1, 0]  # no room after step 1 and step 3; room after 2
    # the node goes while step 4 runs: its loss is found by the generate call (its group reissued) or, when the
    # generation had already returned, by the weight sync (test_rollout_node_loss.py sees the same): once either way
    generate, sync = rows[3]["rollout/worker_restarts"], rows[3].get("sync/engine_restarts", 0)
    assert generate + sync == 1 and rows[3]["rollout/groups_reissued"] == generate
    assert [r["sync/version"] for r in rows] == [1, 2, 3, 4] and groups == 2  # the job's + engine 0's
    for step, trained in controller.trained.items():  # 2 groups of 4 samples each step: none lost, none twice
        assert sorted(trained) == [2 * step, 2 * step + 1] and set(trained.values()) == {4}, step
