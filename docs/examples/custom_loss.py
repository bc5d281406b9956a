"""A policy loss in one file: CISPO (clipped importance-sampling-weight policy optimisation).

CISPO, MiniMax 2025 ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
arXiv 2506.13585), eq. 4-5: instead of clipping the token update (PPO, where a clipped token leaves the
gradient), clip the importance weight and stop its gradient, so every token keeps a REINFORCE gradient:

    loss_t = -sg(min(ratio_t, 1 + eps_high)) * A_t * log pi(o_t),   ratio_t = pi(o_t) / pi_old(o_t)

MiniMax-M1 sets no lower bound on the weight; ``eps_high`` is ``algo.clip_high`` here (a weight cap of
``1 + clip_high``). The TIS weight, the KL term and the aggregation are the shared parts, as in
``ppo_clip``. Use it in a run (the trainer actor imports the plugin when it first meets the name)::

    python -m orchestrator configs/grpo_arith_cpu.yaml algo.policy_loss=cispo_example algo.clip_high=4.0 \
        "algo.plugins=[$PWD/docs/examples/custom_loss.py]"

It registers as ``cispo_example``: the built-in ``cispo`` (orchestrator/algo/losses_extra.py) is the full
loss with its own clip keys (``algo.cispo_clip_low`` / ``cispo_clip_high``); this file shows how one is written.

tests/unit/test_extending_algo.py imports this file and checks correctness case C14.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from orchestrator.algo import LossInputs, finish_loss, masked_terms, register_policy_loss


@register_policy_loss("cispo_example")
def cispo_example(inputs: LossInputs, cfg: Any) -> tuple[Tensor, dict[str, float]]:
    """CISPO loss over one micro-batch (MiniMax 2025, eq. 4-5): a float32 scalar and ``actor/*`` metrics.

    ``[B, T]`` inputs as in ``LossInputs``; ``actor/clip_frac`` is the fraction of tokens whose weight is
    capped. Gradient per token with respect to ``log pi``: ``-min(ratio, 1 + clip_high) * A`` (never 0).
    """
    t = masked_terms(inputs)  # mask, masked logprobs / old logprobs / advantages, the policy ratio
    cap = 1.0 + cfg.clip_high
    pg = -torch.clamp(t.ratio, max=cap).detach() * t.advantages * t.logprobs
    return finish_loss(pg, t.ratio > cap, t, inputs, cfg)  # TIS, KL, aggregation, metrics: as every loss
