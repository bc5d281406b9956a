"""Nodes join, are drained and leave a running elastic job (docs/elastic.md), on several raylets on this machine
(ray.cluster_utils.Cluster) with the collective weight sync (weight_sync.strategy=nccl: our gloo group on CPU). One
node with one custom resource `slot` and the resource `stable` (placement.trainer_node_resource: the only node the job
group may use) holds the trainer and the reward actor, one the first engine (every bundle asks one `slot`).

A node joins before step 2: the cluster has room for one more engine's placement group, so after step 2 an engine is
added there (the decision is scripted to "add when there is room": the rules are unit-tested in
tests/unit/test_elastic.py); it joins the re-formed group at version 2, verified, and step 3 generates on both
engines. During step 3 the FIRST engine's node is drained (`rl-orch drain --node-id --wait`, in a thread: Ray's drain
request, as `ray drain-node` or Ray's autoscaler makes it, a preemption with a deadline): after step 3 that engine
leaves ahead of its node (the second engine takes index 0; the group re-formed) and no other change is made that step;
the node's raylet then exits and the drain returns 0 before step 4. A third node joins before step 4
and an engine is added on it after step 4. That node leaves as step 5's generate call reaches its engine (found
there, or at the step's weight sync when the generation had already returned): its group cannot be placed again, so
the engine leaves the job (above rollout.min_workers) instead of stopping the run; its groups go to the other engine
and the group is re-formed without it. Every step trains its whole groups, none twice.
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
import ray

import orchestrator.placement.elastic_pool as elastic_pool
from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.drain import group_nodes
from orchestrator.placement.elastic import PoolDecision
from orchestrator.runtime.faults import fault_hook
from orchestrator.weight_sync import compare_checksums
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _wait_alive(node_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        assert time.time() < deadline, f"node {node_id} did not join within {timeout_s:g} s"
        time.sleep(0.1)


class JoinDrainLeave(GRPOController):
    """Adds a `slot` node before steps 2 and 4; drains engine 0's node in step 3; removes the last node as step 5's
    generate call reaches rollout worker 1."""

    def __init__(self, cfg, cluster):
        super().__init__(cfg)
        self.cluster, self.node, self.at, self.trained, self.removed, self.drained = cluster, None, 0, {}, False, None
        self.waiter, self.drain_rc = None, []

    def step(self, step: int):
        self.at = step
        if step == 4:  # the drain's --wait returned once the drained node left (its engine retired after step 3)
            self.waiter.join(timeout=60)
            assert self.drain_rc == [0]
        if step in (2, 4):
            self.node = self.cluster.add_node(num_cpus=0, resources={"slot": 1})
            _wait_alive(self.node.node_id)  # not Cluster.wait_for_nodes: the drained node ends once idle
        if step == 3:  # `rl-orch drain --wait` (what the Slurm join job and the Helm chart's preStop hook run)
            self.drained = self.engine_nodes()[0]
            argv = ["drain", "--address", self.cluster.address, "--node-id", self.drained, "--deadline-s", "600",
                    "--wait"]
            self.waiter = threading.Thread(target=lambda: self.drain_rc.append(main(argv)), daemon=True)
            self.waiter.start()
        return super().step(step)

    def engine_nodes(self) -> list[str]:
        slots = self.actors.plan.slots["rollout"][: len(self.actors.rollout)]
        return [sorted(group_nodes(self.actors.pgs[s.group]))[0] for s in slots]

    def train(self, trajs, advantages, ref):
        self.trained[self.at] = Counter(t.group_id for t in trajs)
        return super().train(trajs, advantages, ref)

    def remove(self, window: str, k: int, handle) -> None:
        if window == "generate" and self.at == 5 and k == 1 and not self.removed:
            self.removed = True
            self.cluster.remove_node(self.node, allow_graceful=False)


def test_engines_join_on_new_nodes_leave_a_drained_node_first_and_leave_with_a_lost_node(cluster, tiny_model,
                                                                                           tmp_path, monkeypatch):
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: PoolDecision(
        "add" if room else "hold", engines, f"placement.elastic: {'add' if room else 'hold'} (scripted: room={room})"))
    # the trainer's node: the only one advertising placement.trainer_node_resource, so the job group (trainer, reward)
    # goes there and nowhere else; the first engine's node
    stable = cluster.add_node(num_cpus=1, resources={"slot": 1, "stable": 1})
    cluster.add_node(num_cpus=0, resources={"slot": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, tmp_path, **{"trainer.total_steps": 5})
                      + [REWARD, "placement.resource=slot", "placement.trainer_per_worker=1", "memory.preflight=false",
                         "placement.rollout_per_worker=1", "placement.timeout_s=5", "weight_sync.strategy=nccl",
                         "placement.elastic=true", "rollout.max_workers=2", "sizing.warmup_steps=1",
                         "placement.trainer_node_resource=stable"])
    controller = JoinDrainLeave(cfg, cluster)
    try:
        with fault_hook(controller.remove):
            result = controller.run()
        assert controller.removed and len(controller.actors.rollout) == 1
        assert controller.engine_nodes()[0] not in (controller.drained, controller.node.node_id)
        _, meta_ref = controller.actors.trainer.weights_for_sync.options(num_returns=2).remote("float32")
        engine = ray.get(controller.actors.rollout[0].checksums.remote())
        assert engine["version"] == 5
        compare_checksums(ray.get(meta_ref)["groups"], engine["groups"])
        live = [g.name for g in controller.actors.plan.groups if g.bundles]
        job_nodes = set(ray.util.placement_group_table(controller.actors.pgs[0])["bundles_to_node_id"].values())
        assert job_nodes == {stable.node_id}  # the trainer and the reward actor on the node advertising `stable`
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    # the count at each step's end, before that step's decision: steps 3 and 5 ran on two engines; step 5 ended with
    # the lost node's engine gone
    assert [r["engines/active"] for r in rows] == [1, 1, 2, 1, 1]
    assert [r.get("elastic/added") for r in rows[:4]] == [0, 1, 0, 1]  # no room after step 1; room after 2 and 4
    assert [r.get("elastic/drained") for r in rows[:4]] == [0, 0, 1, 0] and rows[2]["elastic/retired"] == 1
    # the node goes while step 5 runs: its loss is found by the generate call (its group reissued) or, when the
    # generation had already returned, by the weight sync (test_rollout_node_loss.py sees the same): once either way
    generate, sync = rows[4]["rollout/worker_restarts"], rows[4].get("sync/engine_restarts", 0)
    assert generate + sync == 1 and rows[4]["rollout/groups_reissued"] == generate
    assert [r["sync/version"] for r in rows] == [1, 2, 3, 4, 5]
    assert live == ["rl-orch-job", "rl-orch-engine-2"]  # the surviving engine's, added after step 2 (group 2)
    for step, trained in controller.trained.items():  # 2 groups of 4 samples each step: none lost, none twice
        assert sorted(trained) == [2 * step, 2 * step + 1] and set(trained.values()) == {4}, step
