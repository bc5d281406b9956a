"""The reference model: a frozen copy of the initial policy that scores trajectories (KL anchor).

Started only when `algo.kl_coef > 0`. Logprobs use the sampling temperature, as the policy's do.
"""
from __future__ import annotations

from typing import Optional

import ray
import torch
from transformers import AutoModelForCausalLM

from actors.model import prefix_share
from actors.model.forward import batch_logprobs
from actors.model import attention
from actors.pinning import pin_from_env_count
from orchestrator.algo.sampler_support import Sampling


class Reference:
    """Frozen policy copy. `logprobs` returns per-response-token logprobs [B][len(response_i)], in padded
    micro-batches of `micro_batch_size` or, with `micro_batch_tokens`, packed rows of that many tokens.
    `shared_prefix` (trainer.shared_prefix): padded micro-batches run each distinct prompt once
    (actors/model/prefix_share.py); ignored with packed rows or a model that path does not support.
    `attn_implementation` (trainer.attn_implementation): see actors/model/attention.py."""

    def __init__(self, model_path: str, temperature: Sampling, micro_batch_size: int, precision: str = "fp32",
                 pad_id: int = 0, num_threads: int = 0, micro_batch_tokens: Optional[int] = None,
                 shared_prefix: bool = True, attn_implementation: str = "auto"):
        torch.set_num_threads(num_threads or pin_from_env_count())  # fake GPUs: pinned cores (actors/pinning.py)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        impl = self._attn_implementation(attn_implementation, micro_batch_tokens is not None, precision)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                          **attention.load_kwargs(impl)).to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.temperature, self.micro_batch_size, self.precision, self.pad_id = (
            temperature, micro_batch_size, precision, pad_id)
        self.micro_batch_tokens = micro_batch_tokens
        self.shared_prefix = (shared_prefix and micro_batch_tokens is None and impl != "flash_attention_2"
                              and prefix_share.model_fallback_reason(self.model) is None)

    def _attn_implementation(self, requested: str, packing: bool, precision: str):
        """The transformers attention to load (actors/model/attention.py; the context-parallel reference
        overrides it with the ring's)."""
        return attention.resolve_attn_implementation(requested, on_cuda=torch.cuda.is_available(), packing=packing,
                                                     precision=precision, flash_available=attention.flash_attn_available())

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        if self.shared_prefix:
            return prefix_share.batch_logprobs(self.model, prompt_ids, response_ids, self.temperature,
                                               self.micro_batch_size, self.precision, self.pad_id)
        return batch_logprobs(self.model, prompt_ids, response_ids, self.temperature, self.micro_batch_size,
                              self.precision, self.pad_id, micro_batch_tokens=self.micro_batch_tokens)


@ray.remote
class ReferenceActor(Reference):
    """Ray actor over `Reference`."""

    def ready(self) -> bool:
        return True
