"""A per-token advantage estimator in one file: REINFORCE++ (outcome reward, global batch whitening).

REINFORCE++, Hu et al. 2025 ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models", arXiv 2501.03262), section 3: the token reward is the sequence reward on the last response
token (minus a per-token KL, here left to the loss), the advantage of token t is the return
G_t = sum_{s >= t} gamma^(s - t) r_s with gamma = 1, and advantages are normalised over every response
token of the global batch (a global baseline instead of GRPO's per-group one):

    A_t = (G_t - mean(G)) / (std(G) + eps),   mean / unbiased std over the batch's response tokens.

Use it in a run (the trainer never sees estimators; the controller imports the plugin at config load)::

    python -m orchestrator configs/grpo_arith_cpu.yaml algo.estimator=reinforce_pp \
        "algo.plugins=[$PWD/docs/examples/custom_estimator.py]"

tests/unit/test_extending_algo.py imports this file and checks hand-computed values. A built-in now exists
(`algo.estimator=reinforce_plus_plus`, orchestrator/algo/reinforce.py; and `reinforce_plus_plus_baseline`): on
outcome rewards it gives this file's numbers; this file stays as the worked example of a per-token plugin.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from orchestrator.algo import AdvantageInputs, masked, register_advantage_estimator


def outcome_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, T]``: each sample's reward on its last trained response token, 0 elsewhere (and on empty rows)."""
    mask = response_mask != 0
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).amax(dim=-1, keepdim=True)
    return torch.where(positions == last, rewards.unsqueeze(-1).to(torch.float64), torch.zeros((), dtype=torch.float64))


@register_advantage_estimator("reinforce_pp")
def reinforce_pp(inputs: AdvantageInputs, cfg: Any) -> Tensor:
    """REINFORCE++ advantages ``[B, T]`` float64 (Hu et al. 2025, section 3; gamma = 1).

    Token rewards are ``inputs.token_rewards`` when given, else the outcome reward on the last trained
    token. The returns are the reverse cumulative sum over each response; a batch whose returns are all
    equal (or that has fewer than two response tokens) gets advantages exactly 0.
    """
    mask = inputs.response_mask != 0
    token_rewards = inputs.token_rewards
    if token_rewards is None:
        token_rewards = outcome_token_rewards(inputs.rewards, mask)
    r = masked(token_rewards.to(torch.float64), mask)
    returns = r.flip(-1).cumsum(-1).flip(-1)  # G_t = sum_{s >= t} r_s
    n = mask.sum()
    if n < 2:
        return torch.zeros_like(returns)
    mean = masked(returns, mask).sum() / n
    centred = masked(returns - mean, mask)
    std = torch.sqrt(centred.square().sum() / (n - 1))
    if std == 0:
        return torch.zeros_like(returns)
    return centred / (std + cfg.adv_eps)
