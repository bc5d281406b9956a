"""The sampler's distribution, replayed in training: temperature and the truncations top-k, top-p and min-p.

vLLM reports the logprob of a sampled token under the distribution it sampled from (`logprobs_mode=
"processed_logprobs"`): ``softmax(z / T)`` restricted to the tokens its truncations kept and renormalised there.
The trainer's, the old and the reference logprobs, the entropy metric and the KL must be computed over the same
support, or the on-policy importance ratio is the kept mass instead of 1 (probabilities [0.5, 0.3, 0.15, 0.05]
with top_p 0.8: the sampler reports log(0.5 / 0.8) for token 0, a full softmax log 0.5, a ratio of 0.8).

``SamplerSettings.scaled(logits, tokens)`` rebuilds the sampler's kept set from the logits in the order vLLM 0.32
applies it (vllm/v1/sample/sampler.py `Sampler.sample`; vllm/v1/sample/ops/topk_topp_sampler.py
`apply_top_k_top_p_pytorch`; vllm/v1/sample/logits_processor/builtin.py `MinPLogitsProcessor`):

1. ``z = logits / T`` (float32);
2. min-p: tokens with ``softmax(z) < min_p * max softmax(z)`` are dropped (Nguyen et al. 2024, "Turning Up the
   Heat: Min-p Sampling", eq. 1);
3. top-k: tokens below the k-th largest ``z`` are dropped (ties at the k-th value kept, as vLLM);
4. top-p: over the remaining tokens sorted ascending, those whose cumulative probability is <= 1 - top_p are
   dropped, the most probable one always kept (Holtzman et al. 2020, "The Curious Case of Neural Text
   Degeneration", eq. 2-3);

and keeps the sampled ``tokens`` whatever the logits say (the sampler kept them: a boundary token whose
cumulative mass lies within rounding of the threshold cannot fall out). Dropped tokens get ``-inf``; a
log-softmax over the result is the sampler's processed logprob. On the policy that sampled, with the same logits
up to fp32 rounding, the kept sets are the sampler's except where a token's cumulative mass is within rounding
of the threshold, so on-policy ratios are 1 to fp32 noise. Pure torch; no Ray, no vLLM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplerSettings:
    """One value for the sampling distribution, handed to the engine, the trainer and the reference alike.

    Attributes:
        temperature: > 0, finite.
        top_p: in (0, 1]; 1 = off.
        top_k: >= 0 tokens; 0 = off (vLLM's -1 is accepted as off too).
        min_p: in [0, 1); 0 = off.

    Raises:
        ValueError: a value out of range, naming it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature: must be finite and > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k: must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p: must be in [0, 1), got {self.min_p}")

    @classmethod
    def from_rollout(cls, rollout: Any) -> "SamplerSettings":
        """From the config's ``rollout`` section (temperature, top_p, top_k, min_p)."""
        return cls(float(rollout.temperature), float(rollout.top_p), int(rollout.top_k), float(rollout.min_p))

    @property
    def truncates(self) -> bool:
        """Whether any truncation is on (else the distribution is ``softmax(z / T)`` over the whole vocabulary)."""
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0

    def vllm_kwargs(self) -> dict:
        """The keyword arguments of ``vllm.SamplingParams`` for this distribution."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": max(self.top_k, 0),
                "min_p": self.min_p}

    def scaled(self, logits: Tensor, tokens: Optional[Tensor] = None) -> Tensor:
        """``logits / T`` in float32 with ``-inf`` outside the sampler's kept set (module docstring).

        Args:
            logits: ``[..., V]`` floating; differentiable (the dropped entries get no gradient).
            tokens: ``logits.shape[:-1]`` integer ids always kept (the sampled tokens), or None.

        Returns:
            ``[..., V]`` float32.
        """
        z = logits.float() / self.temperature
        if not self.truncates:
            return z
        with torch.no_grad():
            keep = self.kept(z.detach())
            if tokens is not None:
                keep.scatter_(-1, tokens.long().unsqueeze(-1), True)
        return z.masked_fill(~keep, -math.inf)

    def kept(self, z: Tensor) -> Tensor:
        """``[..., V]`` bool: the tokens the sampler keeps for temperature-scaled logits ``z`` (no gradient)."""
        keep = torch.ones_like(z, dtype=torch.bool)
        if self.min_p > 0:
            probs = torch.softmax(z, dim=-1)
            keep &= probs >= self.min_p * probs.amax(dim=-1, keepdim=True)
        masked = z.masked_fill(~keep, -math.inf)
        if 0 < self.top_k < z.shape[-1]:
            top = masked.topk(self.top_k, dim=-1)
            keep &= masked >= top.values[..., -1:]
            if self.top_p < 1 and bool((keep.sum(dim=-1) == self.top_k).all()):  # no tie at the k-th value
                return keep & self._top_p_of_top_k(top.values, top.indices, keep)
            masked = masked.masked_fill(~keep, -math.inf)
        if self.top_p < 1:
            ascending, order = masked.sort(dim=-1)
            cumulative = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
            drop = cumulative <= 1 - self.top_p
            drop[..., -1] = False  # at least one
            keep &= ~torch.zeros_like(drop).scatter_(-1, order, drop)
        return keep


    def _top_p_of_top_k(self, values: Tensor, indices: Tensor, keep: Tensor) -> Tensor:
        """Top-p over the k kept tokens only (`values` descending, their `indices`): the same mask as the sort of
        the whole vocabulary, where every other token is -inf, at the cost of k instead of V."""
        ascending, order = values.flip(-1), indices.flip(-1)
        drop = torch.softmax(ascending, dim=-1).cumsum(dim=-1) <= 1 - self.top_p
        drop[..., -1] = False  # at least one
        return ~torch.zeros_like(keep).scatter_(-1, order, drop)


Sampling = Union[float, SamplerSettings]  # a bare temperature (no truncation) or the whole setting


def as_sampler(sampling: Sampling) -> SamplerSettings:
    """``SamplerSettings`` of a bare temperature (no truncation), or ``sampling`` itself."""
    return sampling if isinstance(sampling, SamplerSettings) else SamplerSettings(temperature=float(sampling))
