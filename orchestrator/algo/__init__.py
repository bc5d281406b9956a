"""Pure torch math of RL post-training and its registries: advantages, logprobs, KL, policy losses, lr schedule.

Nothing here imports Ray, vLLM or ``actors``; every function takes and returns plain tensors or floats.
The algorithm seam: ``@register_advantage_estimator(name)`` and ``@register_policy_loss(name)`` add an
estimator or a loss (one function in one file; docs/algorithms.md), selected by ``algo.estimator`` and
``algo.policy_loss``.
"""

from orchestrator.algo.advantages import (
    ADVANTAGE_ESTIMATORS, AdvantageConfig, AdvantageInputs, broadcast_to_tokens, compute_advantages,
    compute_token_advantages, group_stats, register_advantage_estimator, sequence_abs_mean,
)
from orchestrator.algo.gae import gae_advantages_returns, gae_from_inputs, token_level_rewards  # registers "gae"
from orchestrator.algo.batch import TrainBatch, response_mask_tensor, token_rows
from orchestrator.algo.kl import kl_penalty
from orchestrator.algo.logprobs import position_ids_from_attention_mask, token_logprobs
from orchestrator.algo.loss import (
    POLICY_LOSSES, LossAgg, LossConfig, LossInputs, MaskedTerms, compute_policy_loss, finish_loss, loss_normalizer,
    masked_terms, policy_loss, register_policy_loss,
)
from orchestrator.algo.loss_parts import (
    add_kl, aggregate, clipped_surrogate, dual_clip, importance_weight, kl_term, loss_metrics, masked, policy_ratio,
    step_metrics,
)
from orchestrator.algo import losses_extra  # noqa: F401  (registers gspo, gspo_token, cispo)
from orchestrator.algo.entropy import EntropySink, token_entropy
from orchestrator.algo import reinforce  # noqa: F401 - registers reinforce_plus_plus(_baseline)
from orchestrator.algo.registry import import_plugins
from orchestrator.algo.sampler_support import Sampling, SamplerSettings
from orchestrator.algo.schedule import lr_multiplier

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "Sampling",
    "SamplerSettings",
    "AdvantageConfig",
    "AdvantageInputs",
    "LossAgg",
    "LossConfig",
    "LossInputs",
    "MaskedTerms",
    "TrainBatch",
    "add_kl",
    "aggregate",
    "broadcast_to_tokens",
    "clipped_surrogate",
    "dual_clip",
    "EntropySink",
    "finish_loss",
    "gae_advantages_returns",
    "gae_from_inputs",
    "compute_advantages",
    "compute_policy_loss",
    "compute_token_advantages",
    "group_stats",
    "import_plugins",
    "importance_weight",
    "kl_penalty",
    "kl_term",
    "loss_metrics",
    "loss_normalizer",
    "lr_multiplier",
    "masked",
    "masked_terms",
    "policy_loss",
    "policy_ratio",
    "position_ids_from_attention_mask",
    "register_advantage_estimator",
    "register_policy_loss",
    "response_mask_tensor",
    "sequence_abs_mean",
    "step_metrics",
    "token_entropy",
    "token_logprobs",
    "token_level_rewards",
    "token_rows",
]
