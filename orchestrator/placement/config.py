"""The `placement` and `sizing` sections of the run config: where the actors run (resources per role, the
placement-group strategy, fake GPUs on CPU hosts) and `placement.auto`'s re-placement after `sizing.warmup_steps`
measured steps (orchestrator/placement/replace.py, orchestrator/sizing); `check_placement_section` checks what
involves other fields.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.fields import choice, number


@dataclass
class PlacementConfig:
    # The resource every role's bundle asks for: "GPU" on GPU clusters, "CPU" (or a custom resource
    # such as "fake_gpu") for CPU runs.
    resource: str = "CPU"
    trainer_per_worker: float = number(0.5, ge=0, finite=True)
    rollout_per_worker: float = number(0.5, ge=0, finite=True)
    reference_per_worker: float = number(0.25, ge=0, finite=True)
    reward_cpus: float = number(0.25, ge=0, finite=True)  # the reward actor always asks for CPU
    strategy: str = choice("PACK", ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    timeout_s: float = number(60.0, gt=0)  # the job fails, naming the missing resources, after this long
    # Where the actors run. colocated: trainer, reference and rollout share the same devices, time-sliced (vLLM
    # sleeps while the trainer runs, on GPUs); disaggregated: separate bundles per role. When batches generate is
    # rollout.mode's. disaggregated_async (deprecated) = disaggregated with rollout.mode=one_step_off (or stream).
    mode: str = choice("disaggregated", ("disaggregated", "colocated", "disaggregated_async"))
    # CPU runs: the local Ray advertises this many `fake_gpu` resources (placement.resource=fake_gpu);
    # each fake GPU is one CPU core and the actors in its bundle are pinned to that core. 0 = off.
    fake_gpus: int = number(0, ge=0, finite=True)
    # Apply the sizer's recommendation after sizing.warmup_steps: checkpoint, new placement groups, resume.
    auto: bool = False
    # Add and retire rollout engines while the run goes, between rollout.min_workers and rollout.max_workers, from the
    # measured phase times (orchestrator/placement/elastic.py; docs/elastic.md). Engines get placement groups of their own.
    elastic: bool = False
    # A custom Ray resource only the nodes that may hold the job group advertise (the trainer, reference, critic,
    # reward and env actors; colocated: its engines too): each of its bundles asks TRAINER_NODE_SHARE of it, so they
    # stay off other nodes, e.g. preemptible ones that only take rollout engines (docs/elastic.md). "" = any node.
    trainer_node_resource: str = ""


@dataclass
class SizingConfig:
    # placement.auto: steps measured before the sizer re-places the actors
    warmup_steps: int = number(3, gt=0)
    # devices the sizer may use; 0 = as many as the current placement holds
    total_gpus: int = number(0, ge=0, finite=True)
    # placement.elastic: steps measured after a change of the engine count before the next decision (no flapping)
    cooldown_steps: int = number(2, ge=2, note="(the first step at a count is dropped as warm-up)")


def check_placement_section(cfg) -> None:
    """placement.resource's spelling (`_check_resource_name`), fake GPUs (`_check_fake_gpus`) and placement.auto
    against the run's length (`_check_auto_placement`).

    Raises ValueError naming the key; orchestrator/config/load.py `validate` calls it (as ConfigError)."""
    _check_resource_name(cfg)
    _check_fake_gpus(cfg)
    _check_auto_placement(cfg)
    _check_elastic(cfg)


RAY_RESOURCES = ("CPU", "GPU", "TPU", "fake_gpu")  # Ray's own names (case-sensitive) and the CPU runs' fake GPUs


def _check_resource_name(cfg) -> None:
    """placement.resource spelled like one of Ray's resources in another case ("gpu", "Cpu") names a custom resource
    no node advertises: the job would wait placement.timeout_s and fail. Refused, naming the right spelling.
    placement.trainer_node_resource must be a custom resource (not one every node has)."""
    given = cfg.placement.resource
    for name in RAY_RESOURCES:
        if given != name and given.lower() == name.lower():
            raise ValueError(f"placement.resource={given!r}: Ray's resource names are case-sensitive and no node "
                             f"advertises {given!r}; use {name!r}")
    tag = cfg.placement.trainer_node_resource
    if tag and (tag.upper() in ("CPU", "GPU", "TPU", "MEMORY", "OBJECT_STORE_MEMORY") or tag == given):
        raise ValueError(f"placement.trainer_node_resource={tag!r}: name a custom resource that only the nodes allowed "
                         "to hold the trainer advertise (e.g. 'rl_orch_trainer_node', `ray start --resources`), not "
                         "one every node has or placement.resource")


def _check_fake_gpus(cfg) -> None:
    """placement.fake_gpus > 0 needs placement.resource=fake_gpu (the local Ray advertises that resource) and
    at most this host's cores (each fake GPU is one core its actors are pinned to; orchestrator/placement/plan.py)."""
    n = cfg.placement.fake_gpus
    if n <= 0:
        return
    if cfg.placement.resource != "fake_gpu":
        raise ValueError(f"placement.fake_gpus={n} is set with placement.resource={cfg.placement.resource!r}: fake GPUs "
                         "are the custom resource 'fake_gpu'; set placement.resource=fake_gpu or placement.fake_gpus=0")
    import os

    cores = len(os.sched_getaffinity(0))
    if n > cores:
        raise ValueError(f"placement.fake_gpus={n} exceeds this host's {cores} cores: each fake GPU is one CPU core; "
                         f"use at most {cores}")


def _check_auto_placement(cfg) -> None:
    """placement.auto re-places the actors after sizing.warmup_steps steps (orchestrator/placement/replace.py): that
    step must come before the run's last one, or the measurement is never used."""
    if cfg.placement.auto and cfg.sizing.warmup_steps >= cfg.trainer.total_steps:
        raise ValueError(f"sizing.warmup_steps={cfg.sizing.warmup_steps} with placement.auto=true must be below "
                         f"trainer.total_steps={cfg.trainer.total_steps}: the re-placement after the warm-up steps "
                         "would never run; lower sizing.warmup_steps or set placement.auto=false")


def engine_range(cfg) -> tuple[int, int]:
    """(min, max) rollout engines of a run: rollout.min_workers / max_workers, 0 meaning rollout.num_workers."""
    r = cfg.rollout
    return (r.min_workers or r.num_workers, r.max_workers or r.num_workers)


def _check_elastic(cfg) -> None:
    """rollout.min_workers <= rollout.num_workers <= rollout.max_workers (each 0 = num_workers); placement.elastic
    where it is built: env actors in threads (multi-turn), measured steps before the run's last one, and a range that
    allows a change (every rollout.mode; colocated placement is sync only, orchestrator/config/rollout_mode.py)."""
    lo, hi = engine_range(cfg)
    r = cfg.rollout
    if lo > r.num_workers:
        raise ValueError(f"rollout.min_workers={r.min_workers} is above rollout.num_workers={r.num_workers}: the run "
                         "starts with num_workers engines and never goes below min_workers (0 = num_workers)")
    if hi < r.num_workers:
        raise ValueError(f"rollout.max_workers={r.max_workers} is below rollout.num_workers={r.num_workers}: the run "
                         "starts with num_workers engines and never goes above max_workers (0 = num_workers)")
    ranged = [f"rollout.{k}={v}" for k, v in (("min_workers", r.min_workers), ("max_workers", r.max_workers))
              if v and v != r.num_workers]
    if ranged and not cfg.placement.elastic:
        raise ValueError(f"{' and '.join(ranged)} set with placement.elastic=false: the engine count stays at "
                         f"rollout.num_workers={r.num_workers}; set placement.elastic=true to let it change "
                         "(docs/elastic.md), or leave them 0")
    spares = cfg.rollout.spare_workers
    if spares and (cfg.placement.mode == "colocated" or getattr(cfg.env, "placement", "thread") == "actor"):
        raise ValueError(f"rollout.spare_workers={spares} needs placement.mode=disaggregated and env.placement=thread "
                         "(a spare engine has a placement group of its own, without env actors); set "
                         "rollout.spare_workers=0")
    if not cfg.placement.elastic:
        return
    if cfg.env.name and getattr(cfg.env, "placement", "thread") == "actor":
        raise ValueError("placement.elastic=true needs env.placement=thread with a multi-turn env (got 'actor': a "
                         "rollout worker's env actors are bundles of the job group, planned for the engines it starts "
                         "with; docs/elastic.md); set env.placement=thread or placement.elastic=false")
    p = cfg.placement
    if p.mode == "colocated" and str(p.resource).upper() == "GPU" and p.rollout_per_worker < 1:
        raise ValueError(f"placement.elastic=true with placement.mode=colocated on GPUs needs "
                         f"placement.rollout_per_worker=1 (got {p.rollout_per_worker:g}): an added engine gets a group "
                         "of its own asking that share of a GPU per bundle, and two engines on one GPU at the colocated "
                         "rollout.gpu_memory_utilization would not fit (docs/elastic.md)")
    if cfg.placement.auto:
        raise ValueError("placement.elastic=true with placement.auto=true: the re-placement would start the engines "
                         "again at rollout.num_workers, outside what the elastic run decided; use one of them")
    if lo == hi:
        raise ValueError(f"placement.elastic=true with rollout.min_workers = rollout.max_workers = {lo}: nothing can "
                         "change; set a range (e.g. rollout.max_workers) or placement.elastic=false")
    if cfg.sizing.warmup_steps >= cfg.trainer.total_steps:
        raise ValueError(f"sizing.warmup_steps={cfg.sizing.warmup_steps} with placement.elastic=true must be below "
                         f"trainer.total_steps={cfg.trainer.total_steps}: the first decision would never run")
