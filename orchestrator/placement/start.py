"""The role actors of a job in their placement groups: `Actors` (the handles) and how each role starts in its
planned slot (orchestrator/placement/plan.py) of the groups reserved all at once (orchestrator/placement/groups.py,
gang scheduling). The job (orchestrator/job.py) owns what this returns.

    actors = start_actors(cfg, model_path, resume_from, pad_id, warm_up)   # Ray, groups, every actor, ready
    worker = start_rollout_worker(cfg, actors.plan, actors.pgs, k, model_path, resume_from)   # a replacement

Trainer, critic and reference start as one actor or as D ranks of one torch.distributed group (rank 0 the leader:
actors/model/data_parallel.py); every actor gets its slot's bundle, resources and environment (pinned cores with
fake GPUs, vLLM's worker bundles for a tensor-parallel engine).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import ray

from actors.pinning import CORES_ENV, engine_env
from orchestrator.algo.sampler_support import SamplerSettings
from orchestrator.placement.groups import env_actor_options, remove_groups, reserve_groups, slot_options
from orchestrator.placement.plan import ActorSlot, JobPlan, on_gpu, plan_job, shares_device
from orchestrator.runtime.malloc_env import tunables_env
from orchestrator.runtime.ray_connect import QUIET_ENV, connect_ray


@dataclass
class Actors:
    """Handles of the job's actors and its placement groups (`pg`: the job group, `pgs`: all of them)."""

    trainer: Any  # rank 0 of the trainer (the leader with trainer.num_workers > 1)
    rollout: list
    reward: Any
    reference: Optional[Any] = None
    pg: Any = None
    all: list = field(default_factory=list)
    trainer_ranks: list = field(default_factory=list)  # all D trainer ranks, rank 0 first
    pgs: list = field(default_factory=list)
    plan: Any = None  # the JobPlan (orchestrator/placement/plan.py)
    critic: Optional[Any] = None  # PPO's value model (actors/critic.py), when algo.estimator=gae: rank 0 (the leader)
    critic_ranks: list = field(default_factory=list)  # all C = critic.num_workers critic ranks, rank 0 first
    reference_ranks: list = field(default_factory=list)  # the c reference ranks (context parallelism), rank 0 first

    def shutdown(self) -> None:
        try:
            ray.get(self.reward.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - best effort: the actor may already be gone
            pass
        for a in self.all:
            ray.kill(a)
        remove_groups(self.pgs or ([self.pg] if self.pg is not None else []))


def start_actors(cfg, model_path: Path, resume_from: Optional[Path], pad_id: int,
                 warm_up: tuple[int, int, int]) -> Actors:
    """Reserve every placement group (gang scheduling), then start trainer x D, rollout x R, reference, reward;
    the trainer warms up (trainer.warm_up) for `warm_up` = (prompt tokens, response tokens, group size: the longest
    sequence the run feeds it, orchestrator/memory/preflight.py `longest_sequence`, in groups of rollout.n) while the
    engines start."""
    connect_ray(cfg)
    plan = plan_job(cfg)
    pgs = reserve_groups(plan.groups, cfg.placement.timeout_s, cfg.placement.resource)

    try:
        return _start_in_groups(cfg, plan, pgs, model_path, resume_from, pad_id, warm_up)
    except BaseException:
        remove_groups(pgs)  # a failed start leaves nothing reserved (removing a group kills its actors)
        raise


def _start_in_groups(cfg, plan: JobPlan, pgs: list, model_path: Path, resume_from: Optional[Path], pad_id: int,
                     warm_up: tuple[int, int, int]) -> Actors:
    from actors.reward import start_reward_actor

    def opts(role: str, k: int = 0) -> dict:
        return actor_options(plan, pgs, role, k, run_env(cfg))

    ranks = _start_trainers(cfg, opts, str(model_path), pad_id)
    trainer = ranks[0]
    rollout = [start_rollout_worker(cfg, plan, pgs, k, model_path, resume_from) for k in range(cfg.rollout.num_workers)]
    references = _start_reference(cfg, opts, str(model_path), pad_id) if cfg.algo.kl_coef > 0 else []
    reference = references[0] if references else None
    reward = start_reward_actor(cfg.reward, opts("reward"))  # concurrent calls unless a reward model is loaded
    critics = _start_critic(cfg, opts, str(model_path), pad_id) if cfg.algo.estimator == "gae" else []
    warming = [r.warm_up.remote(*warm_up) for r in ranks] if cfg.trainer.warm_up else []  # while engines start
    everyone = [*ranks, *rollout, reward, *references, *critics]
    actors = Actors(trainer, rollout, reward, reference, pgs[0], everyone, trainer_ranks=ranks, pgs=pgs, plan=plan,
                    critic=critics[0] if critics else None, critic_ranks=critics, reference_ranks=references)
    ray.get([*warming, *(a.ready.remote() for a in actors.all)])  # every actor up (a bad reward model fails here)
    for group in (ranks, critics, references):  # a leader fans every call out to its ranks 1..D-1
        if len(group) > 1:
            ray.get(group[0].set_peers.remote(group[1:]))
    return actors


def start_rollout_worker(cfg, plan: JobPlan, pgs: list, k: int, model_path: Path, resume_from: Optional[Path],
                         role: str = "rollout"):
    """Rollout worker k (not waited for) in its slot (`role` "spare": the k-th spare engine's slot, rollout seed
    offset by SPARE_SEED_OFFSET); its engine loads the checkpoint's policy on resume (the controller then syncs and
    verifies), the base model otherwise."""
    from actors.rollout.worker import RolloutWorkerActor

    engine_path = str(resume_from / "policy") if resume_from else str(model_path)
    colocated = shares_device(cfg, plan.slots[role][k])  # it sleeps while the trainer trains (GPU)
    env_slots = plan.slots.get("env", []) if role == "rollout" else []  # env.placement=actor: the worker's own
    env_actors = env_actor_options(env_slots, pgs, k, cfg.env.num_actors)
    seed = cfg.rollout.seed + k + (SPARE_SEED_OFFSET if role == "spare" else 0)
    return RolloutWorkerActor.options(**actor_options(plan, pgs, role, k, run_env(cfg))).remote(
        engine_path, cfg.rollout, seed, colocated=colocated, env_actors=env_actors)


SPARE_SEED_OFFSET = 10_000  # a spare engine's worker seed: rollout.seed + 10000 + its index (requests carry their own)


def run_env(cfg) -> dict[str, str]:
    """Environment variables every actor of the run gets (`actor_options`): glibc's malloc settings for
    `run.glibc_tunables` (orchestrator/runtime/malloc_env.py; "auto": on CPU runs only, placement.resource other than
    "GPU")."""
    return tunables_env(cfg.run.glibc_tunables, gpu=on_gpu(cfg))


def actor_options(plan: JobPlan, pgs: list, role: str, k: int = 0, env: Optional[dict] = None) -> dict:
    """`.options(...)` of the k-th actor of `role`: its placement group and bundle, its resources and its
    environment (`env`, e.g. `run_env(cfg)`; pinned cores with fake GPUs, vLLM's worker bundles for a
    tensor-parallel engine)."""
    slot = plan.slots[role][k]
    return {**slot_options(pgs, slot), "runtime_env": {"env_vars": {**QUIET_ENV, **(env or {}), **slot_env(slot)}}}


def slot_env(slot: ActorSlot) -> dict[str, str]:
    """Environment of a planned actor: its pinned cores (fake GPUs) and, for a rollout engine, vLLM's CPU
    thread binding; a tensor-parallel engine also gets the bundles and device share of its vLLM workers."""
    env: dict[str, str] = {}
    if slot.cores:
        env = engine_env(slot.cores) if slot.role == "rollout" else {CORES_ENV: ",".join(map(str, slot.cores[0]))}
    if slot.worker_bundles:
        env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, slot.worker_bundles))
        env["VLLM_RAY_PER_WORKER_GPUS"] = f"{slot.worker_share:g}"
    return env


def _start_trainers(cfg, opts, model_path: str, pad_id: int) -> list:
    """One TrainerActor, or D = trainer.num_workers ShardedTrainerActor ranks (FSDP2, actors/trainer/sharded.py)
    that form one torch.distributed group while they start (`_start_ranks`); rank 0 first."""
    from actors.trainer.trainer import TrainerActor

    args = (model_path, cfg.trainer, cfg.algo, SamplerSettings.from_rollout(cfg.rollout), cfg.rollout.max_new_tokens,
            pad_id)  # the sampling distribution the engines sample from, replayed (orchestrator/algo/sampler_support.py)
    if cfg.trainer.num_workers == 1:
        return [TrainerActor.options(**opts("trainer")).remote(*args)]
    from actors.trainer.sharded import ShardedTrainerActor

    return _start_ranks(ShardedTrainerActor, opts, "trainer", cfg.trainer.num_workers, cfg.run.phase_timeout_s, *args)


def _start_critic(cfg, opts, model_path: str, pad_id: int) -> list:
    """PPO's value model (the policy's base model with a value head): one CriticActor (actors/critic.py), or
    C = critic.num_workers ShardedCriticActor ranks (FSDP2, actors/critic_sharded.py; `_start_ranks`)."""
    args = (model_path, cfg.critic, cfg.algo, cfg.trainer.precision, cfg.rollout.max_new_tokens, pad_id,
            cfg.trainer.num_threads, cfg.trainer.seed)
    c = cfg.critic.num_workers
    if c == 1:
        from actors.critic import CriticActor

        return [CriticActor.options(**opts("critic")).remote(*args)]
    from actors.critic_sharded import ShardedCriticActor

    return _start_ranks(ShardedCriticActor, opts, "critic", c, cfg.run.phase_timeout_s, *args)


def _start_ranks(actor_cls, opts, role: str, n: int, timeout_s: float, *args, **kwargs) -> list:
    """`n` ranks of `actor_cls` in the role's slots, forming one torch.distributed group as they start; rank 0 first."""
    group = f"{role}-{uuid.uuid4().hex[:12]}"
    return [actor_cls.options(**opts(role, r)).remote(*args, **kwargs, rank=r, world_size=n, group_name=group,
                                                      timeout_s=timeout_s) for r in range(n)]


def _start_reference(cfg, opts, model_path: str, pad_id: int) -> list:
    """The reference model (algo.kl_coef > 0): one ReferenceActor (actors/reference.py), or with
    trainer.context_parallel_size = c > 1 c ContextParallelReferenceActor ranks (actors/reference_cp.py; `_start_ranks`)."""
    packed = cfg.trainer.micro_batch_tokens if cfg.trainer.packing else None
    args = (model_path, SamplerSettings.from_rollout(cfg.rollout), cfg.trainer.micro_batch_size, cfg.trainer.precision,
            pad_id, cfg.trainer.num_threads)
    c = cfg.trainer.context_parallel_size
    if c == 1:
        from actors.reference import ReferenceActor

        return [ReferenceActor.options(**opts("reference")).remote(
            *args, micro_batch_tokens=packed, shared_prefix=cfg.trainer.shared_prefix,
            attn_implementation=cfg.trainer.attn_implementation)]
    from actors.reference_cp import ContextParallelReferenceActor

    return _start_ranks(ContextParallelReferenceActor, opts, "reference", c, cfg.run.phase_timeout_s, *args,
                        micro_batch_tokens=packed)
