"""Pure torch math of GRPO-style RL post-training: advantages, logprobs, KL, policy loss, lr schedule.

Nothing here imports Ray, vLLM or ``actors``; every function takes and returns plain tensors or floats.
"""

from orchestrator.algo.advantages import compute_advantages
from orchestrator.algo.kl import kl_penalty
from orchestrator.algo.logprobs import position_ids_from_attention_mask, token_logprobs
from orchestrator.algo.loss import LossAgg, loss_normalizer, policy_loss
from orchestrator.algo.schedule import lr_multiplier

__all__ = [
    "LossAgg",
    "compute_advantages",
    "kl_penalty",
    "loss_normalizer",
    "lr_multiplier",
    "policy_loss",
    "position_ids_from_attention_mask",
    "token_logprobs",
]
