"""Connect to Ray and start the job's actors inside one gang-scheduled placement group.

Without `run.ray_address` or RAY_ADDRESS a run starts its own local Ray; with either, it joins that
cluster (this is what `ray job submit` gives the entrypoint).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import ray

from orchestrator.placement import bundle_options, plan_bundles, reserve

# vLLM's CPU backend repeats harmless warnings every step; users can set VLLM_LOGGING_LEVEL themselves.
_QUIET_ENV = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"), "TOKENIZERS_PARALLELISM": "false"}


def connect_ray(cfg) -> None:
    """Join `run.ray_address` / $RAY_ADDRESS, or start a local Ray with `run.num_cpus` CPUs."""
    if ray.is_initialized():
        return
    address = cfg.run.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:  # address="local": a new local Ray, never a leftover `ray start` cluster found on this machine
        ray.init(address="local", num_cpus=cfg.run.num_cpus or None, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": _QUIET_ENV})


@dataclass
class Actors:
    """Handles of the job's actors and its placement group."""

    trainer: Any
    rollout: list
    reward: Any
    reference: Optional[Any] = None
    pg: Any = None
    all: list = field(default_factory=list)

    def shutdown(self) -> None:
        try:
            ray.get(self.reward.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - best effort: the actor may already be gone
            pass
        for a in self.all:
            ray.kill(a)
        if self.pg is not None:
            ray.util.remove_placement_group(self.pg)


def start_actors(cfg, model_path: Path, resume_from: Optional[Path], pad_id: int) -> Actors:
    """Reserve every bundle (gang scheduling), then start trainer, rollout x R, reference, reward."""
    from actors.reference import ReferenceActor
    from actors.reward import RewardActor
    from actors.rollout.worker import RolloutWorkerActor
    from actors.trainer import TrainerActor

    connect_ray(cfg)
    plan = plan_bundles(cfg)
    pg = reserve(plan, cfg.placement.strategy, cfg.placement.timeout_s)

    def opts(role: str, k: int = 0) -> dict:
        i = plan.roles[role][k]
        return {**bundle_options(pg, i, plan.bundles[i]), "runtime_env": {"env_vars": _QUIET_ENV}}

    # on resume the engines start from the checkpoint's policy; the controller then syncs and verifies
    engine_path = str(resume_from / "policy") if resume_from else str(model_path)
    temp, max_new = cfg.rollout.temperature, cfg.rollout.max_new_tokens
    trainer = TrainerActor.options(**opts("trainer")).remote(str(model_path), cfg.trainer, cfg.algo, temp, max_new, pad_id)
    rollout = [RolloutWorkerActor.options(**opts("rollout", k)).remote(engine_path, cfg.rollout, cfg.rollout.seed + k)
               for k in range(cfg.rollout.num_workers)]
    reference = None
    if cfg.algo.kl_coef > 0:
        reference = ReferenceActor.options(**opts("reference")).remote(
            str(model_path), temp, cfg.trainer.micro_batch_size, cfg.trainer.precision, pad_id, cfg.trainer.num_threads)
    functions = [(f.name, f.weight) for f in cfg.reward.functions]
    rm = cfg.reward.model_path
    rm_spec = {"path": rm, "weight": cfg.reward.model_weight, "batch_size": cfg.reward.model_batch_size} if rm else None
    reward = RewardActor.options(**opts("reward")).remote(functions, cfg.reward.timeout_s, cfg.reward.num_workers,
                                                          reward_model=rm_spec)
    actors = Actors(trainer, rollout, reward, reference, pg, [trainer, *rollout, reward] + ([reference] if reference else []))
    ray.get([a.ready.remote() for a in actors.all])  # every actor up (a bad reward model fails here)
    return actors
