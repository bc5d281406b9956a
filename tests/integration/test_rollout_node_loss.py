"""A lost node (docs/faults.md): several raylets on this machine (ray.cluster_utils.Cluster). The head holds
the reward actor (CPU only); two nodes with one custom resource `slot` each hold the trainer and the rollout
worker (one each: every bundle asks one `slot`). The rollout worker's node is removed while step 2
generates, a spare node added just before: the bundle is re-placed there, the worker restarted in it and the run
goes on. The spare node is removed while step 4 generates, with no node left to hold the bundle: the run stops
naming the missing resources.
"""
from __future__ import annotations

import json

import pytest
import ray

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.groups import PlacementError
from orchestrator.runtime.faults import fault_hook
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{"trainer.total_steps": 3})
                       + [REWARD, "placement.resource=slot", "placement.trainer_per_worker=1",
                          "placement.rollout_per_worker=1", "memory.preflight=false", *extra])


class RemoveNodeDuringGenerate(GRPOController):
    """Removes the rollout worker's node as a step's generate call reaches it (orchestrator/runtime/faults.py
    `fault_hook`): at step 2 after adding a spare node, at step 4 without one."""

    SPARE_AT, NO_ROOM_AT = 2, 4

    def __init__(self, cfg, cluster):
        super().__init__(cfg)
        self.cluster, self.spare_node, self.lost, self.at, self.removed_at = cluster, None, [], 0, set()

    def run(self):
        with fault_hook(self._remove_node):
            return super().run()

    def step(self, step: int):
        self.at = step
        if step == self.SPARE_AT:
            self.spare_node = self.cluster.add_node(num_cpus=0, resources={"slot": 1})
            self.cluster.wait_for_nodes()
        return super().step(step)

    def _remove_node(self, window: str, k: int, handle) -> None:
        if window != "generate" or self.at not in (self.SPARE_AT, self.NO_ROOM_AT) or self.at in self.removed_at:
            return  # (once a step: the reissued groups' call reaches the replacement)
        self.removed_at.add(self.at)
        node_id = _rollout_node(self)
        lost = next(n for n in self.cluster.list_all_nodes() if n.node_id == node_id)
        assert not lost.head
        self.lost.append(lost)
        self.cluster.remove_node(lost, allow_graceful=False)


def _start(cluster, tiny_model, tmp_path, *extra):
    for _ in range(2):
        cluster.add_node(num_cpus=0, resources={"slot": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return RemoveNodeDuringGenerate(_cfg(tiny_model, tmp_path, *extra), cluster)


def _rollout_node(controller) -> str:
    slot = controller.job.actors.plan.slots["rollout"][0]
    table = ray.util.placement_group_table(controller.job.actors.pgs[slot.group])
    return table["bundles_to_node_id"][slot.bundle]


# One run, two losses: step 2's is survived on the spare node added just before it; step 4's (the spare node
# itself) finds no room and stops the run naming the missing resources.
def test_a_lost_node_is_survived_on_a_spare_node_and_without_room_stops_naming_the_missing_resources(
        cluster, tiny_model, tmp_path):
    controller = _start(cluster, tiny_model, tmp_path, "trainer.total_steps=5", "placement.timeout_s=5")
    try:
        with pytest.raises(PlacementError, match=r"rollout worker 0 cannot be restarted.*placement.timeout_s=5s"
                                                 r".*'slot': \(2\.0, 1\.0\).*checkpoint.resume=auto"):
            controller.run()
        assert len(controller.lost) == 2 and controller.lost[1].node_id == controller.spare_node.node_id
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 4 stopped the run: no row
    # the node goes while step 2 runs: its loss is found by the generate call (the groups reissued) or, when the
    # generation had already returned, by the weight sync (the engine replaced there): one restart either way
    generate = [r["rollout/worker_restarts"] for r in rows]
    sync = [r.get("sync/engine_restarts", 0) for r in rows]
    assert sum(generate) + sum(sync) == 1 and generate[0] == sync[0] == 0
    assert [r["rollout/groups_reissued"] for r in rows] == [2 * g for g in generate]
    assert rows[-1]["sync/version"] == 3  # step 3 trained and synced on the worker restarted on the spare node
