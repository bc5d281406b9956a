"""Placement groups and gang scheduling: every group of the job is reserved together, or the job fails.

The plan (orchestrator/placement/plan.py) gives the job group (trainer ranks, rollout engines with t = 1,
the reference when KL is on, the reward actor; or, colocated, one bundle per shared device) and one
STRICT_PACK group per tensor-parallel engine. The resource each bundle asks for comes from config
(`placement.resource`: "GPU" on GPU clusters, "CPU" or a custom resource such as "fake_gpu" on CPU
machines). `reserve_groups` creates every group, then waits for all of them: if any is not ready within
`placement.timeout_s`, the job fails with a message naming each group that is not ready, what it asked
for and what the cluster has, and every group it created is removed, before any actor starts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.placement.plan import (TRAINER_NODE_SHARE, ActorSlot, GroupPlan, PlacementError, engine_node_hints,
                                         plan_job, total_asked)

__all__ = ["PlacementError", "RolePlan", "plan_bundles", "missing_resources", "reserve", "reserve_groups",
           "bundle_options", "slot_options", "remove_groups", "env_actor_options"]


@dataclass
class RolePlan:
    """Bundle indices of each role inside the job's placement group."""

    bundles: list[dict[str, float]]
    roles: dict[str, list[int]]


def plan_bundles(cfg) -> RolePlan:
    """The job group of `plan_job(cfg)` (without core mapping): disaggregated, one bundle per actor:
    trainer x D (FSDP2 ranks in rank order), rollout x R (t = 1; t > 1 engines have their own groups),
    reference (kl_coef > 0), reward (CPU only)."""
    plan = plan_job(cfg, pin=False)  # the bundles do not depend on the core mapping
    roles: dict[str, list[int]] = {}
    for role, slots in plan.slots.items():
        for s in slots:
            if s.group == 0:
                roles.setdefault(role, []).append(s.bundle)
    return RolePlan(plan.groups[0].bundles, roles)


def missing_resources(bundles: list[dict[str, float]], total: dict[str, float]) -> dict[str, tuple[float, float]]:
    """{resource: (needed, cluster total)} for every resource the bundles need more of than exists."""
    need = total_asked([GroupPlan("", bundles, "PACK")])
    return {k: (v, total.get(k, 0.0)) for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}


def reserve(plan: RolePlan, strategy: str, timeout_s: float) -> PlacementGroup:
    """One group of `plan.bundles` (see `reserve_groups`); returns it when ready."""
    return reserve_groups([GroupPlan("rl-orch-job", plan.bundles, strategy)], timeout_s)[0]


def _alive_nodes(resource: str) -> list[tuple[str, float]]:
    nodes = [(n["NodeID"], float(n.get("Resources", {}).get(resource, 0.0))) for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes)


def reserve_groups(groups: Sequence[GroupPlan], timeout_s: float, resource: Optional[str] = None) -> list[PlacementGroup]:
    """Create every group, wait until all are ready (gang scheduling), return them in order.

    STRICT_PACK engine groups (named rl-orch-rollout-*) get soft node hints from the job group's strategy
    on a multi-node cluster (`engine_node_hints`). Raises PlacementError after `timeout_s` seconds naming
    each group that is not ready, its strategy and bundles, the job's totals against the cluster's and
    what is available now; every group created here is removed first."""
    engines = [g for g in groups if g.name.startswith("rl-orch-rollout-")]
    if engines and resource and groups[0].strategy:
        per = sum(b.get(resource, 0.0) for b in engines[0].bundles)
        for g, hint in zip(engines, engine_node_hints(len(engines), per, _alive_nodes(resource), groups[0].strategy)):
            g.node_hint = hint
    pgs: list[PlacementGroup] = []
    try:
        for g in groups:
            kw = {"_soft_target_node_id": g.node_hint} if g.node_hint else {}
            pgs.append(placement_group(g.bundles, strategy=g.strategy, name=g.name, **kw))
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=timeout_s)
    except BaseException:
        remove_groups(pgs)
        raise
    if len(ready) == len(pgs):
        return pgs
    waiting = [g for g, pg in zip(groups, pgs) if not _is_created(pg)]
    available = ray.available_resources()
    remove_groups(pgs)
    raise PlacementError(_gang_message(groups, waiting, timeout_s, available))


def wait_placed(pg: PlacementGroup, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Whether every bundle of `pg` is placed (state CREATED) within `timeout_s` seconds. After a node is
    lost Ray re-places its bundles (state RESCHEDULING) where the cluster can hold them."""
    deadline = time.monotonic() + timeout_s
    while not _is_created(pg):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _is_created(pg: PlacementGroup) -> bool:
    try:
        return ray.util.placement_group_table(pg).get("state") == "CREATED"
    except Exception:  # noqa: BLE001 - the table is only used to sharpen the message
        return False


def _gang_message(groups: Sequence[GroupPlan], waiting: Sequence[GroupPlan], timeout_s: float,
                  available: dict) -> str:
    total = ray.cluster_resources()
    need = total_asked(groups)
    short = {k: (v, total.get(k, 0.0)) for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}
    names = "; ".join(f"group {g.name} ({g.strategy}, bundles {g.bundles})" for g in waiting) or "(all created late)"
    avail = {k: round(v, 4) for k, v in available.items() if k in need}
    tagged = sorted({k for b in groups[0].bundles for k, v in b.items() if v == TRAINER_NODE_SHARE} if groups else [])
    if tagged:  # placement.trainer_node_resource: the job group only on the nodes advertising it
        names += (f" (the job group's bundles go only to nodes advertising {tagged[0]!r}: "
                  f"placement.trainer_node_resource; such a node needs room for the whole job group's share of it)")
    if short:
        lack = "; ".join(f"{k}: need {n:g}, cluster has {h:g}" for k, (n, h) in short.items())
        return (f"the cluster cannot hold the job: {lack}. Not ready after placement.timeout_s={timeout_s:g}s: "
                f"{names}; available now: {avail}. Lower the per-role amounts under placement.*, the rollout "
                f"replicas or rollout.tensor_parallel_size, env.num_actors / env.actor_cpus (env.placement=actor), "
                f"or add nodes (an autoscaler adds them while the job waits). Every placement group was removed.")
    return (f"placement groups not ready after placement.timeout_s={timeout_s:g}s; the totals fit (asked "
            f"{ {k: round(v, 4) for k, v in need.items()} }, cluster has { {k: total.get(k, 0.0) for k in need} }) "
            f"but these could not be placed: {names}; available now: {avail}. Every placement group was removed.")


def remove_groups(pgs: Sequence[PlacementGroup]) -> None:
    """Remove every group (best effort: a group already gone is skipped)."""
    for pg in pgs:
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - removing a removed group raises; nothing else to do
            pass


def bundle_options(pg: PlacementGroup, index: int, resources: dict[str, float], capture_child_tasks: bool = False) -> dict:
    """`.options(...)` kwargs placing an actor in bundle `index` and asking for its resources."""
    opts: dict = {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index,
        placement_group_capture_child_tasks=capture_child_tasks)}
    opts["num_cpus"] = resources.get("CPU", 0)
    opts["num_gpus"] = resources.get("GPU", 0)
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        opts["resources"] = custom
    return opts


def slot_options(pgs: Sequence[PlacementGroup], slot: ActorSlot) -> dict:
    """`.options(...)` kwargs of one planned actor (its group, bundle, resources; a TP engine captures
    its child tasks so vLLM's Ray workers land in its group)."""
    return bundle_options(pgs[slot.group], slot.bundle, slot.resources, slot.capture_child_tasks)


def env_actor_options(slots: Sequence[ActorSlot], pgs: Sequence[PlacementGroup], k: int, per_worker: int) -> list[dict]:
    """`.options(...)` of rollout worker k's env actors (env.placement=actor): the "env" `slots` k*per_worker ..
    k*per_worker+per_worker-1 of the plan; [] when the plan has none (thread placement)."""
    return [slot_options(pgs, s) for s in list(slots)[k * per_worker:(k + 1) * per_worker]]
