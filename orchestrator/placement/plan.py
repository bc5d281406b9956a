"""The job's placement plan: which placement groups, which bundles, which actor sits where (pure, no Ray).

Modes (`placement.mode`):
- disaggregated (every rollout.mode places the same way): one bundle per actor in the job
  group: trainer x D (`trainer_per_worker` each), rollout x R (`rollout_per_worker`), the reference x c
  (`reference_per_worker` each, when algo.kl_coef > 0; c = trainer.context_parallel_size), the critic x C (`critic.per_worker` each, C =
  `critic.num_workers`, when algo.estimator=gae) and the reward actor (`reward_cpus` CPU).
- colocated: one bundle per device, {resource: 1.0}, max(D, R*t, C) of them; device d holds trainer rank d,
  the rollout engine (rank) on it, critic rank d and reference rank d (c of them, usually one); the actors sharing a device each ask
  for an equal fraction of it (1/k, rounded down to Ray's 1e-4 resource grain) and take turns
  (time-slicing: vLLM sleeps while the trainer trains, see orchestrator/placement/modes.py).

Tensor-parallel engines (`rollout.tensor_parallel_size` t > 1), the way OpenRLHF and verl give vLLM its
GPUs: the engine actor (the vLLM driver, in-process engine core) sits in its first bundle asking for no
device, with `placement_group_capture_child_tasks=True`; vLLM's Ray executor finds that placement group
(`ray.util.get_current_placement_group()`, vllm/v1/executor/ray_utils.py) and starts one worker per bundle
listed in VLLM_RAY_BUNDLE_INDICES, each asking VLLM_RAY_PER_WORKER_GPUS of the device. Disaggregated: each
engine has its own group of t bundles with STRICT_PACK (one node); replicas are spread or packed over nodes
by `placement.strategy` through per-group node hints (`engine_node_hints`). Colocated: the engine's t
device bundles are inside the job group (devices e*t .. e*t+t-1).

Environment actors (`env.placement=actor`, env.name set), both modes: env.num_actors bundles per rollout
worker, {CPU: env.actor_cpus} each, appended to the job group (role "env", rollout worker k's actors are
slots k*A .. k*A+A-1); they ask for no device, so with a PACK or SPREAD job group Ray may put them on
CPU-only nodes.

`placement.trainer_node_resource` (a custom resource name): every bundle of the job group also asks
TRAINER_NODE_SHARE of it, so the job group is placed only on the nodes that advertise it (engines in groups of their
own go anywhere: preemptible nodes that only take engines).

Fake GPUs (`placement.resource=fake_gpu`, `placement.fake_gpus=N`): device j is host core j; bundles are
mapped to devices first-fit in plan order (`map_cores`) and each actor gets the cores of its bundles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

RAY_GRAIN = 1e-4  # Ray keeps resource amounts in fixed point with 4 decimals
# what each bundle of the job group asks of placement.trainer_node_resource: a node advertising 1 holds 1000 bundles
TRAINER_NODE_SHARE = 0.001


class PlacementError(RuntimeError):
    """The cluster (or the fake GPUs) cannot hold the job; the message names what is missing."""


@dataclass
class GroupPlan:
    """One placement group: its name (in error messages and `ray.util.placement_group_table()`), its
    bundles ({resource: amount}) and Ray strategy; `node_hint` is set by `engine_node_hints` (multi-node)."""

    name: str
    bundles: list[dict[str, float]]
    strategy: str
    node_hint: Optional[str] = None


@dataclass
class ActorSlot:
    """Where one actor goes: group index, bundle index, the resources the actor itself asks for, the
    bundles its vLLM workers use (tensor parallel), and its pinned cores per device (fake GPUs; None off)."""

    role: str
    group: int
    bundle: int
    resources: dict[str, float]
    worker_bundles: list[int] = field(default_factory=list)  # t > 1: VLLM_RAY_BUNDLE_INDICES
    worker_share: float = 0.0  # t > 1: VLLM_RAY_PER_WORKER_GPUS
    cores: Optional[list[list[int]]] = None  # one list per bundle of the actor (t lists for a TP engine)

    @property
    def capture_child_tasks(self) -> bool:
        return bool(self.worker_bundles)


@dataclass
class JobPlan:
    """Every placement group of the job and every actor's slot (role -> one slot per actor, rank order)."""

    mode: str
    groups: list[GroupPlan]
    slots: dict[str, list[ActorSlot]]


def on_gpu(cfg) -> bool:
    """Whether the run is placed on real GPUs (placement.resource "GPU", any case; not "CPU" or fake GPUs)."""
    return str(cfg.placement.resource).upper() == "GPU"


def _share(k: int) -> float:
    """1/k of a device rounded down to Ray's grain, so k shares never exceed the device."""
    return round(math.floor(1.0 / k / RAY_GRAIN) * RAY_GRAIN, 4)


def _clean(b: dict[str, float]) -> dict[str, float]:
    b = {k: float(v) for k, v in b.items() if v > 0}
    return b or {"CPU": 0.01}  # Ray rejects empty bundles


def plan_job(cfg, host_cores: Optional[Sequence[int]] = None, pin: bool = True) -> JobPlan:
    """The placement groups and actor slots of `cfg` (see the module docstring for the modes).

    host_cores: core ids device j maps to (default: this process's affinity, sorted); used only with
    fake GPUs and `pin`. Raises PlacementError when the bundles cannot be mapped to `placement.fake_gpus`
    devices."""
    p = cfg.placement
    plan = _plan_colocated(cfg) if p.mode == "colocated" else _plan_disaggregated(cfg)
    if getattr(p, "trainer_node_resource", ""):  # the job group's bundles only on the nodes advertising it
        for b in plan.groups[0].bundles:
            b[p.trainer_node_resource] = TRAINER_NODE_SHARE
    if pin and p.resource == "fake_gpu" and p.fake_gpus > 0:
        if host_cores is None:
            import os

            host_cores = sorted(os.sched_getaffinity(0))
        attach_cores(plan, p.resource, map_cores(plan.groups, p.resource, p.fake_gpus, host_cores))
    return plan


def _plan_disaggregated(cfg) -> JobPlan:
    p, t = cfg.placement, cfg.rollout.tensor_parallel_size
    job = GroupPlan("rl-orch-job", [], p.strategy)
    groups, slots = [job], {}

    def add(role: str, resources: dict[str, float]) -> None:
        slots.setdefault(role, []).append(ActorSlot(role, 0, len(job.bundles), _clean(resources)))
        job.bundles.append(_clean(resources))

    for _ in range(cfg.trainer.num_workers):
        add("trainer", {p.resource: p.trainer_per_worker})
    for k in range(cfg.rollout.num_workers):
        if t == 1 and not p.elastic:
            add("rollout", {p.resource: p.rollout_per_worker})
            continue
        group, slot = engine_group(cfg, k, len(groups))
        groups.append(group)
        slots.setdefault("rollout", []).append(slot)
    for _ in range(reference_ranks(cfg)):
        add("reference", {p.resource: p.reference_per_worker})
    for _ in range(cfg.critic.num_workers if cfg.algo.estimator == "gae" else 0):  # PPO's value model, C ranks
        add("critic", {p.resource: cfg.critic.per_worker})
    add("reward", {"CPU": p.reward_cpus})
    _add_env_slots(cfg, job, slots)
    return JobPlan(p.mode, groups, slots)


def engine_group(cfg, k: int, index: int, prefix: str = "rl-orch-rollout") -> tuple[GroupPlan, ActorSlot]:
    """Rollout engine k's placement group of its own (named `<prefix>-<k>`, STRICT_PACK: one node) and its slot, the
    group being the job's `index`-th: t = rollout.tensor_parallel_size bundles of {placement.resource:
    placement.rollout_per_worker}. t = 1: the engine actor asks for its bundle; t > 1: it asks for nothing and vLLM's
    t workers take the bundles (VLLM_RAY_BUNDLE_INDICES). Disaggregated engines with t > 1 or placement.elastic (an
    engine that leaves frees its group), and engines added while the run goes (orchestrator/placement/elastic.py)."""
    p, t = cfg.placement, cfg.rollout.tensor_parallel_size
    group = GroupPlan(f"{prefix}-{k}", [_clean({p.resource: p.rollout_per_worker}) for _ in range(t)], "STRICT_PACK")
    if t == 1:
        return group, ActorSlot("rollout", index, 0, dict(group.bundles[0]))
    return group, ActorSlot("rollout", index, 0, {}, list(range(t)), p.rollout_per_worker)


def _plan_colocated(cfg) -> JobPlan:
    p, t = cfg.placement, cfg.rollout.tensor_parallel_size
    d, r, kl = cfg.trainer.num_workers, cfg.rollout.num_workers, reference_ranks(cfg)  # reference rank k on device k
    c = cfg.critic.num_workers if cfg.algo.estimator == "gae" else 0  # PPO's critic ranks: rank k on device k
    n_dev = max(d, r * t, c)
    users = [int(i < d) + int(i < r * t) + int(i < kl) + int(i < c) for i in range(n_dev)]
    share = [_share(u) for u in users]
    job = GroupPlan("rl-orch-job", [{p.resource: 1.0} for _ in range(n_dev)] + [_clean({"CPU": p.reward_cpus})],
                    p.strategy)
    slots: dict[str, list[ActorSlot]] = {"trainer": [ActorSlot("trainer", 0, i, {p.resource: share[i]})
                                                     for i in range(d)]}
    if t == 1:
        slots["rollout"] = [ActorSlot("rollout", 0, e, {p.resource: share[e]}) for e in range(r)]
    else:
        slots["rollout"] = [ActorSlot("rollout", 0, e * t, {}, list(range(e * t, e * t + t)),
                                      min(share[e * t : e * t + t])) for e in range(r)]
    if kl:
        slots["reference"] = [ActorSlot("reference", 0, k, {p.resource: share[k]}) for k in range(kl)]
    if c:
        slots["critic"] = [ActorSlot("critic", 0, k, {p.resource: share[k]}) for k in range(c)]
    slots["reward"] = [ActorSlot("reward", 0, n_dev, dict(job.bundles[n_dev]))]
    _add_env_slots(cfg, job, slots)
    return JobPlan(p.mode, [job], slots)


def shares_device(cfg, slot: ActorSlot) -> bool:
    """Whether a rollout engine's slot shares its devices with trainer ranks: placement.mode=colocated and a bundle of
    the job group (group 0). Such an engine sleeps while the trainer trains (orchestrator/placement/modes.py); an
    engine added by placement.elastic has a group of its own, holds no device another role needs, and does not."""
    return cfg.placement.mode == "colocated" and slot.group == 0


def reference_ranks(cfg) -> int:
    """Reference actors the job starts: 0 without KL (algo.kl_coef = 0), else trainer.context_parallel_size (one,
    or c ranks splitting every row as the trainer does: actors/reference_cp.py)."""
    return cfg.trainer.context_parallel_size if cfg.algo.kl_coef > 0 else 0


def _add_env_slots(cfg, job: GroupPlan, slots: dict) -> None:
    """env.num_actors CPU bundles per rollout worker at the end of the job group (env.placement=actor only)."""
    env = getattr(cfg, "env", None)
    if env is None or not env.name or getattr(env, "placement", "thread") != "actor":
        return
    for _ in range(cfg.rollout.num_workers * env.num_actors):
        bundle = {"CPU": float(env.actor_cpus)}
        slots.setdefault("env", []).append(ActorSlot("env", 0, len(job.bundles), dict(bundle)))
        job.bundles.append(bundle)


def map_cores(groups: Sequence[GroupPlan], resource: str, n_devices: int,
              host_cores: Sequence[int]) -> list[list[list[int]]]:
    """Fake GPU devices (= host cores) of every bundle: result[g][b] = core ids of bundle b of group g.

    Bundles are visited in plan order; a bundle asking a <= 1 of `resource` takes the first device with
    a left of its capacity 1.0 (first fit), one asking a > 1 takes ceil(a) wholly free devices; bundles
    without `resource` get []. Device j is host_cores[j]. Raises PlacementError naming the bundle when
    the devices run out, or when n_devices exceeds the host cores."""
    if n_devices > len(host_cores):
        raise PlacementError(f"placement.fake_gpus={n_devices} exceeds this host's {len(host_cores)} cores "
                             f"{list(host_cores)}: each fake GPU is one core")
    free = [1.0] * n_devices
    out: list[list[list[int]]] = []
    for g in groups:
        out.append([])
        for b, bundle in enumerate(g.bundles):
            a = bundle.get(resource, 0.0)
            if a <= 0:
                devices = []
            elif a <= 1:
                devices = [next((j for j in range(n_devices) if free[j] >= a - 1e-9), -1)]
            else:
                whole = [j for j in range(n_devices) if free[j] >= 1 - 1e-9][: math.ceil(a)]
                devices = whole if len(whole) == math.ceil(a) else [-1]
            if -1 in devices:
                asked = sum(bundle.get(resource, 0.0) for gg in groups for bundle in gg.bundles)
                raise PlacementError(f"group {g.name} bundle {b} ({bundle}) does not fit the fake GPUs: the plan asks "
                                     f"{asked:g} {resource} in all, placement.fake_gpus={n_devices} (left per device: "
                                     f"{[round(f, 4) for f in free]})")
            for j in devices:
                free[j] -= min(a, 1.0)
            out[-1].append([host_cores[j] for j in devices])
    return out


def attach_cores(plan: JobPlan, resource: str, cores: list[list[list[int]]]) -> None:
    """Give each actor the cores of its bundles (a TP engine: one list per worker bundle); the reward
    actor, asking only CPU, stays unpinned."""
    for slots in plan.slots.values():
        for s in slots:
            bundles = s.worker_bundles or [s.bundle]
            per = [cores[s.group][b] for b in bundles]
            s.cores = per if any(per) else None


def engine_node_hints(n_groups: int, per_group: float, nodes: Sequence[tuple[str, float]],
                      strategy: str) -> list[Optional[str]]:
    """Soft node targets for the engines' STRICT_PACK groups, one per group, from `placement.strategy`.

    nodes: (node id, amount of the device resource on it), in a fixed order. SPREAD / STRICT_SPREAD:
    round-robin over the nodes that can hold a group; PACK / STRICT_PACK: fill the first such node with
    floor(amount / per_group) groups, then the next. One node or none that fits: no hints (None)."""
    fits = [(n, int(a // per_group + 1e-9)) for n, a in nodes if a + 1e-9 >= per_group]
    if len(nodes) <= 1 or not fits:
        return [None] * n_groups
    if strategy in ("SPREAD", "STRICT_SPREAD"):
        return [fits[k % len(fits)][0] for k in range(n_groups)]
    order = [n for n, cap in fits for _ in range(cap)]
    return [order[k] if k < len(order) else None for k in range(n_groups)]


def total_asked(groups: Sequence[GroupPlan]) -> dict[str, float]:
    """{resource: sum over every bundle of every group}."""
    need: dict[str, float] = {}
    for g in groups:
        for b in g.bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
    return need
