"""Nodes being drained, and the rollout engines on them (docs/elastic.md, "A node drained").

    nodes = draining_nodes()                     # {node id (hex): deadline, ms since the epoch (0: none)}
    on = engines_on_nodes(actors, nodes)         # {rollout worker index: node id} of the engines on those nodes
    fits = room_for_group(bundles, nodes)        # whether one node that is not being drained holds these bundles

Ray marks a node as draining when it is asked to let it go: `ray drain-node` (a preemption notice forwarded by
the user's tooling, a Kubernetes preStop hook), or Ray's autoscaler v2 (KubeRay scaling a worker group down, an idle
node's termination). A draining node takes no new work and goes at its deadline (or when its owner takes it). The
job learns of it between steps and lets the engines there go first (orchestrator/placement/elastic_pool.py): their
groups are not lost mid-step. Both lookups are Ray's developer APIs (`ray._private.state`, as Ray Serve and Ray
Data use them); when they fail the job sees no drain, and a drained engine is handled as a lost one when its node goes
(docs/faults.md).
"""
from __future__ import annotations

import warnings

import ray

from orchestrator.placement.plan import GroupPlan, total_asked


def draining_nodes() -> dict[str, int]:
    """{node id (hex): drain deadline in ms since the epoch, 0 for none} of the live nodes being drained; {} when
    Ray cannot say (a warning names why)."""
    try:
        from ray._private import state

        return {str(k): int(v) for k, v in state.state.get_draining_nodes().items()}
    except Exception as e:  # noqa: BLE001 - a developer API: without it no drain is seen (the loss path remains)
        warnings.warn(f"placement.elastic: Ray's draining nodes could not be read ({type(e).__name__}: {e}); "
                      "an engine on a drained node is handled as lost when the node goes", stacklevel=2)
        return {}


def group_nodes(pg, bundles=None) -> set[str]:
    """The node ids (hex) that a placement group's bundles (`bundles`: these bundle indexes; None: all) are placed
    on (empty while it is not placed)."""
    table = ray.util.placement_group_table(pg)
    where = table.get("bundles_to_node_id") or {}
    return {str(n) for b, n in where.items() if n and (bundles is None or int(b) in bundles)}


def engines_on_nodes(actors, nodes) -> dict[int, str]:
    """{rollout worker index: a node id of `nodes` its bundles are on} for the job's engines (`actors`:
    orchestrator/placement/start.py Actors) that have a bundle on one of `nodes`. Only the engine's own bundles count:
    a colocated engine's are in the job group, whose other bundles hold other actors."""
    found: dict[int, str] = {}
    slots, pgs = actors.plan.slots["rollout"], actors.pgs
    for k, slot in enumerate(slots[: len(actors.rollout)]):
        hit = sorted(group_nodes(pgs[slot.group], set(slot.worker_bundles or [slot.bundle])) & set(nodes))
        if hit:
            found[k] = hit[0]
    return found


def room_for_group(bundles: list[dict], draining=()) -> bool:
    """Whether one live node that is not being drained has every resource of `bundles` free now (a STRICT_PACK
    group's test; Ray's per-node view, which lags the raylets' reports by up to a second)."""
    from ray._private.state import available_resources_per_node

    need = total_asked([GroupPlan("", bundles, "PACK")])
    for node, free in available_resources_per_node().items():
        if node in draining:
            continue
        if all(free.get(k, 0.0) >= v - 1e-9 for k, v in need.items()):
            return True
    return False
