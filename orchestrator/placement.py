"""Placement groups and gang scheduling: every role's bundles are reserved together, or the job fails.

The job asks for one placement group holding a bundle per actor (trainer ranks x D, rollout replicas,
the reference model when KL is on, the reward actor). The resource each bundle asks for comes from
config (`placement.resource`: "GPU" on GPU clusters, "CPU" or a custom resource such as "fake_gpu" on
CPU machines). If the cluster cannot hold the whole job within `placement.timeout_s`, the job fails
with a message naming the missing resources, before any actor starts.
"""
from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class PlacementError(RuntimeError):
    """The cluster cannot hold the job; the message names the missing resources."""


@dataclass
class RolePlan:
    """Bundle indices of each role inside the job's placement group."""

    bundles: list[dict[str, float]]
    roles: dict[str, list[int]]


def plan_bundles(cfg) -> RolePlan:
    """One bundle per actor: trainer x D (trainer.num_workers, FSDP2 ranks in rank order), rollout x R,
    reference (kl_coef > 0), reward (CPU only)."""
    p = cfg.placement
    bundles: list[dict[str, float]] = []
    roles: dict[str, list[int]] = {}

    def add(role: str, resources: dict[str, float]) -> None:
        roles.setdefault(role, []).append(len(bundles))
        bundles.append({k: v for k, v in resources.items() if v > 0})

    for _ in range(cfg.trainer.num_workers):
        add("trainer", {p.resource: p.trainer_per_worker})
    for _ in range(cfg.rollout.num_workers):
        add("rollout", {p.resource: p.rollout_per_worker})
    if cfg.algo.kl_coef > 0:
        add("reference", {p.resource: p.reference_per_worker})
    add("reward", {"CPU": p.reward_cpus})
    for i, b in enumerate(bundles):
        if not b:  # Ray rejects empty bundles
            bundles[i] = {"CPU": 0.01}
    return RolePlan(bundles, roles)


def missing_resources(bundles: list[dict[str, float]], total: dict[str, float]) -> dict[str, tuple[float, float]]:
    """{resource: (needed, cluster total)} for every resource the bundles need more of than exists."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return {k: (v, total.get(k, 0.0)) for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}


def reserve(plan: RolePlan, strategy: str, timeout_s: float) -> PlacementGroup:
    """Create the job's placement group and wait until all bundles are reserved.

    Raises PlacementError naming the missing resources (or the bundles, when the totals suffice but
    the packing does not) after `timeout_s` seconds; the half-made group is removed first.
    """
    pg = placement_group(plan.bundles, strategy=strategy, name="rl-orch-job")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if ready:
        return pg
    remove_placement_group(pg)
    short = missing_resources(plan.bundles, ray.cluster_resources())
    roles = {i: r for r, idx in plan.roles.items() for i in idx}
    wanted = ", ".join(f"{roles[i]}={b}" for i, b in enumerate(plan.bundles))
    if short:
        lack = "; ".join(f"{k}: need {n:g}, cluster has {h:g}" for k, (n, h) in short.items())
        raise PlacementError(f"the cluster cannot hold the job: {lack} (bundles: {wanted}). "
                             f"Lower the per-role amounts under placement.*, or add nodes.")
    raise PlacementError(f"placement group not ready after placement.timeout_s={timeout_s:g}s; the totals fit but "
                         f"the bundles could not be placed with strategy {strategy} (bundles: {wanted}; "
                         f"available now: {ray.available_resources()})")


def bundle_options(pg: PlacementGroup, index: int, resources: dict[str, float]) -> dict:
    """`.options(...)` kwargs placing an actor in bundle `index` and asking for its resources."""
    opts: dict = {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index)}
    opts["num_cpus"] = resources.get("CPU", 0)
    opts["num_gpus"] = resources.get("GPU", 0)
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        opts["resources"] = custom
    return opts
