"""The trainer's mixture-of-experts hook: router load-balancing loss per micro-batch and expert-load metrics.

`RouterAux.for_model` returns None for a dense model. For an MoE policy (its config names a number of
experts: `num_local_experts` (Mixtral) or `num_experts` (Qwen-MoE)) the trainer asks for router logits
in every training forward and adds

    coef * load_balancing_loss(router_logits, top_k, mask=attention_mask) * (real tokens of the micro-batch
                                                                            / real tokens of the mini-batch)

to the micro-batch's policy loss (orchestrator/algo/moe.py; Switch Transformer, Fedus et al. 2021, eq.
4-6; case C12: padding tokens count nowhere). The weights of a mini-batch's micro-batches add up to 1,
like the policy loss's global normaliser, so the aux term's size does not grow or shrink with the number of
micro-batches; with one micro-batch per mini-batch it is exactly the mini-batch's loss. (The loss is a
product of two token means, so splitting a mini-batch changes it slightly: it is then the token-weighted
mean of the micro-batches' losses, as in Megatron-LM and transformers' Trainer with gradient
accumulation.) Per data-parallel rank the weights use the rank's own tokens; averaging the ranks'
gradients gives the mean over ranks.

    moe = RouterAux.for_model(model, coef)
    moe.start(real_tokens)                              # per mini-batch
    loss = loss + moe.add(router_logits, attention_mask)  # per micro-batch, before backward
    metrics.update(moe.finish())                        # actor/router_aux_loss, moe/expert_load_*
"""
from __future__ import annotations

from typing import Optional

import torch

from orchestrator.algo.moe import expert_load_metrics, expert_token_counts, load_balancing_loss


def moe_experts(config) -> tuple[int, int]:
    """(number of experts, experts per token) of an HF config; (0, 0) for a dense model."""
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) or 0
    top_k = getattr(config, "num_experts_per_tok", None) or 0
    return (int(experts), int(top_k)) if experts and top_k else (0, 0)


class RouterAux:
    """Accumulates the aux loss and expert counts over one mini-batch's micro-batches."""

    def __init__(self, num_experts: int, top_k: int, coef: float):
        if coef < 0:
            raise ValueError(f"trainer.router_aux_loss_coef={coef} must be >= 0")
        self.num_experts, self.top_k, self.coef = num_experts, top_k, coef
        self._total, self._aux, self._counts = 1.0, 0.0, None

    @classmethod
    def for_model(cls, model: torch.nn.Module, coef: float) -> Optional["RouterAux"]:
        experts, top_k = moe_experts(model.config)
        return cls(experts, top_k, coef) if experts else None

    def start(self, real_tokens: int) -> None:
        """Begin a mini-batch holding `real_tokens` non-padding tokens (prompts + responses), > 0."""
        if real_tokens <= 0:
            raise ValueError(f"real_tokens: a mini-batch needs at least one token, got {real_tokens}")
        self._total, self._aux, self._counts = float(real_tokens), 0.0, None

    def add(self, router_logits: list, attention_mask: torch.Tensor) -> torch.Tensor:
        """The micro-batch's weighted aux term (scalar, differentiable) to add to its policy loss.

        router_logits: per MoE layer [b * L, E] (forward_logprobs' `router_logits`); attention_mask:
        [b, L], 1 on real tokens. Raises ValueError when the logits do not match the model's experts.
        """
        if not router_logits:
            raise ValueError("router_logits: the MoE forward returned none (output_router_logits ignored?)")
        if router_logits[0].shape[-1] != self.num_experts:
            raise ValueError(f"router_logits: {router_logits[0].shape[-1]} experts, the config says {self.num_experts}")
        mask = attention_mask.to(router_logits[0].device)
        aux = load_balancing_loss(router_logits, self.top_k, mask)
        counts, tokens = expert_token_counts(router_logits, self.top_k, mask)
        weight = tokens / self._total
        self._aux += float(aux.detach()) * weight
        self._counts = counts if self._counts is None else self._counts + counts
        return aux * (self.coef * weight)

    def finish(self) -> dict[str, float]:
        """`actor/router_aux_loss` (token-weighted mean over micro-batches, before the coefficient) and
        `moe/expert_load_max`, `moe/expert_load_cv` over the mini-batch's real tokens."""
        if self._counts is None:
            raise ValueError("RouterAux.finish: no micro-batch was added")
        return {"actor/router_aux_loss": self._aux, **expert_load_metrics(self._counts)}
