"""PPO with a value model: the `critic:` section (the CriticActor, actors/critic.py; GAE's `algo` fields are
orchestrator/algo/config.py `GaeFields`). Read only when `algo.estimator=gae`; docs/algorithms.md."""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.fields import number


@dataclass
class CriticConfig:
    """The value model of PPO (algo.estimator=gae): the policy's base model with a scalar value head."""
    lr: float = number(1e-5, gt=0, le=1)  # AdamW's peak learning rate of the critic
    warmup_steps: int = number(0, ge=0, finite=True)  # linear warmup, then constant
    weight_decay: float = number(0.0, ge=0, finite=True)
    grad_clip: float = number(1.0, ge=0, finite=True)  # max global gradient norm; 0 = no clipping
    micro_batch_size: int = number(8, gt=0)  # sequences per micro-batch (gradient accumulation)
    updates_per_step: int = number(1, gt=0)  # optimizer steps (epochs over the batch) per training step
    # its placement bundle asks this much of placement.resource (disaggregated; colocated: a share of device 0)
    per_worker: float = number(0.5, ge=0, finite=True)
    # D critic ranks sharded with FSDP2 like trainer.num_workers (actors/critic_sharded.py), each in its own bundle
    # of per_worker (colocated: a share of device k); 1 = one process. D divides the batch (check_critic)
    num_workers: int = number(1, ge=1, note="(FSDP2 critic ranks)")


def check_critic(cfg) -> None:
    """With algo.estimator=gae and critic.num_workers = D > 1, D divides the global batch rollout.prompts_per_step
    * rollout.n (the critic updates on the whole batch; every rank takes an equal share). Raises ValueError naming
    both keys."""
    d = cfg.critic.num_workers
    if cfg.algo.estimator != "gae" or d == 1:
        return
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n
    if batch % d:
        raise ValueError(f"critic.num_workers={d} must divide the critic's batch rollout.prompts_per_step * "
                         f"rollout.n = {batch}: every critic rank takes an equal share")
