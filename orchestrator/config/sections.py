"""The checks of the run config's sections, each owned by its package, in the order `validate` runs them
(orchestrator/config/load.py; before the checks across sections). Each takes the whole config and raises
ValueError naming the key (`validate` re-raises it as ConfigError).

A section's fields live beside its check (orchestrator/<package>/config.py; orchestrator/config/schema.py composes
them into `Config`): a new section adds its dataclass there, its field in `Config` and its check here.
"""
from __future__ import annotations

from orchestrator.data.checks import check_data_sources
from orchestrator.eval.checks import check_eval_config
from orchestrator.guards.config import check_guards_section
from orchestrator.metrics.config import check_metrics_section
from orchestrator.placement.config import check_placement_section
from orchestrator.reward.config import check_reward_section
from orchestrator.rollout.config import check_rollout_section
from orchestrator.weight_sync.config import check_weight_sync_section

SECTION_CHECKS = (
    check_metrics_section,  # metrics.sinks and metrics.trackers resolve
    check_weight_sync_section,  # weight_sync.strategy resolves
    check_rollout_section,  # rollout.engine=async_llm against the strategy and tensor parallelism
    check_reward_section,  # reward.functions: one at least, each resolves
    check_guards_section,  # spike factors, the KL guard against algo.kl_coef
    check_data_sources,  # data.source and eval.data: built-in ranges, reasoning-gym tasks
    check_eval_config,  # eval.* against reward.functions and rollout.max_model_len
    check_placement_section,  # fake GPUs, placement.auto against trainer.total_steps
)
