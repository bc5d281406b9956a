"""Router load-balancing loss (orchestrator/algo/moe.py): case C12 and agreement with transformers."""
from __future__ import annotations

import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from orchestrator.algo.moe import expert_load_metrics, expert_token_counts, load_balancing_loss

# C12: two experts, top-1, one layer, attention mask [1, 1, 0, 0]
C12_LOGITS = [torch.tensor([[2.0, 0.0], [0.0, 2.0], [3.0, 0.0], [3.0, 0.0]])]
C12_MASK = torch.tensor([[1, 1, 0, 0]])


def test_c12_padding_is_ignored():
    # real tokens: one on each expert (f = [1/2, 1/2]); P = mean of softmax([2,0]) and softmax([0,2]) = [1/2, 1/2]
    # -> 2 * (1/4 + 1/4) = 1
    assert float(load_balancing_loss(C12_LOGITS, top_k=1, mask=C12_MASK)) == pytest.approx(1.0, abs=1e-4)


def test_c12_unmasked_is_the_fault():
    # counting the pads: f = [3/4, 1/4], P = [(1 + 2 * 0.95257) / 4, ...] -> 1.2263
    assert float(load_balancing_loss(C12_LOGITS, top_k=1)) == pytest.approx(1.2263, abs=1e-4)


def test_agrees_with_transformers_load_balancing_loss_func():
    torch.manual_seed(0)
    b, L, E, k = 3, 7, 8, 2
    logits = tuple(torch.randn(b * L, E) for _ in range(4))
    mask = (torch.rand(b, L) > 0.3).long()
    mask[:, 0] = 1
    ours = load_balancing_loss(logits, top_k=k, mask=mask)
    theirs = load_balancing_loss_func(logits, num_experts=E, top_k=k, attention_mask=mask)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    assert float(load_balancing_loss(logits, top_k=k)) == pytest.approx(
        float(load_balancing_loss_func(logits, num_experts=E, top_k=k)), rel=1e-6)


def test_gradient_flows_through_router_probabilities_only_on_real_tokens():
    logits = [C12_LOGITS[0].clone().requires_grad_(True)]
    load_balancing_loss(logits, top_k=1, mask=C12_MASK).backward()
    g = logits[0].grad
    assert torch.all(g[2:] == 0) and g[:2].abs().sum() > 0


def test_expert_counts_and_load_metrics():
    counts, tokens = expert_token_counts(C12_LOGITS, top_k=1, mask=C12_MASK)
    assert tokens == 2.0 and counts.tolist() == [[1.0, 1.0]]
    assert expert_load_metrics(counts) == {"moe/expert_load_max": 1.0, "moe/expert_load_cv": 0.0}
    # unmasked: 3 of 4 tokens on expert 0 -> max fraction 0.75 = 1.5 x ideal; cv = 0.25 / 0.5
    counts, _ = expert_token_counts(C12_LOGITS, top_k=1)
    m = expert_load_metrics(counts)
    assert m["moe/expert_load_max"] == pytest.approx(1.5) and m["moe/expert_load_cv"] == pytest.approx(0.5)


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="top_k"):
        load_balancing_loss(C12_LOGITS, top_k=3)
    with pytest.raises(ValueError, match="mask"):
        load_balancing_loss(C12_LOGITS, top_k=1, mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="no real token"):
        load_balancing_loss(C12_LOGITS, top_k=1, mask=torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"router_logits\[1\]"):
        load_balancing_loss([torch.zeros(4, 2), torch.zeros(3, 2)], top_k=1)
