"""Per-token KL-divergence estimators between the policy and the frozen reference model.

Used as the KL penalty in the GRPO loss (``kl_coef * kl_penalty(...)``). The three estimators are
Schulman 2020, "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html): k1, k2, k3, all
estimating KL(policy || reference) from samples drawn from the policy. Pure torch; no Ray, no vLLM.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")

# The log ratio is clamped to this range before exp() in k3 so that a far-off token cannot overflow.
_K3_LOG_RATIO_CLAMP = 20.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate from policy and reference logprobs of the sampled tokens.

    With ``d = logprobs - ref_logprobs`` (Schulman 2020, "Approximating KL divergence"):
        - ``"k1"``: ``d`` (unbiased, high variance, can be negative);
        - ``"k2"``: ``0.5 * d**2`` (biased, low variance, >= 0);
        - ``"k3"``: ``exp(-d) - (-d) - 1`` (unbiased, low variance, >= 0), the estimator of GRPO,
          Shao et al. 2024, eq. 4. The log ratio ``ref_logprobs - logprobs`` is clamped to
          ``[-20, 20]`` before ``exp`` for numerical stability (so values and gradients saturate for
          tokens whose log ratio exceeds 20 in magnitude).

    Args:
        logprobs: ``[B, T]`` float, policy logprobs of the sampled tokens (differentiable).
        ref_logprobs: ``[B, T]`` float, reference-model logprobs of the same tokens.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]`` per-token KL estimates, dtype of ``logprobs``; unmasked (the caller applies masks).

    Raises:
        ValueError: unknown ``estimator`` (the message lists the allowed values) or shapes that differ.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator: unknown value {estimator!r}; allowed: {list(KL_ESTIMATORS)}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs: shape {tuple(ref_logprobs.shape)} does not match logprobs shape "
            f"{tuple(logprobs.shape)}"
        )
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    neg = torch.clamp(-log_ratio, min=-_K3_LOG_RATIO_CLAMP, max=_K3_LOG_RATIO_CLAMP)
    return torch.exp(neg) - neg - 1.0
