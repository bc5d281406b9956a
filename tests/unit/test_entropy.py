"""Token entropy from the forward's logits (orchestrator/algo/entropy.py, actors/model/forward.py,
actors/model/prefix_share.py): hand values, chunking, gradient, and the same numbers on the plain,
packed and shared-prompt paths."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import orchestrator.algo.entropy as entropy_mod
from actors.model.forward import collate, collate_packed, forward_logprobs, per_sequence
from actors.model.prefix_share import shared_prefix_logprobs
from orchestrator.algo import EntropySink, token_entropy


def test_hand_values_and_temperature() -> None:
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [5.0, 5.0]])
    h = token_entropy(logits)
    p = torch.tensor([0.25, 0.75])
    torch.testing.assert_close(h, torch.tensor([math.log(2), float(-(p * p.log()).sum()), math.log(2)]))
    assert h[1].item() == pytest.approx(0.562335, abs=1e-6)
    # temperature 2 halves the logits: [0, log 3] -> probabilities 1 : sqrt 3
    q = torch.tensor([1.0, math.sqrt(3.0)]) / (1 + math.sqrt(3.0))
    assert token_entropy(logits[1], temperature=2.0).item() == pytest.approx(float(-(q * q.log()).sum()), abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        token_entropy(logits, temperature=0.0)


def test_chunks_and_gradient_match_the_unchunked_formula(monkeypatch) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 11, generator=g)
    full = token_entropy(x, 0.7)
    monkeypatch.setattr(entropy_mod, "_MAX_CHUNK_ELEMENTS", 2 * 11)  # 2 positions per chunk: 8 chunks
    torch.testing.assert_close(token_entropy(x, 0.7), full, atol=1e-6, rtol=0)
    a = x.clone().requires_grad_(True)
    token_entropy(a, 0.7, grad=True).sum().backward()  # checkpointed chunks
    b = x.clone().requires_grad_(True)
    logp = torch.log_softmax(b / 0.7, dim=-1)
    (-(logp.exp() * logp).sum(-1)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
    assert not token_entropy(x.clone().requires_grad_(True), 0.7, grad=False).requires_grad


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


PROMPTS = [[5, 6, 7], [5, 6, 7], [9, 10], [9, 10]]
RESPONSES = [[11, 12], [13, 14, 15], [16], [17, 18, 19, 20]]


def _reference(model, temperature: float) -> list[list[float]]:
    """Entropy from the full logits of a plain forward, one sample at a time."""
    out = []
    for p, r in zip(PROMPTS, RESPONSES):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        logp = torch.log_softmax(logits / temperature, dim=-1)
        out.append((-(logp.exp() * logp).sum(-1)).tolist())
    return out


def _values(t: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [t[i][mask[i]].tolist() for i in range(t.shape[0])]


def test_plain_packed_and_shared_prefix_paths_give_the_same_entropy(model) -> None:
    ref = _reference(model, 0.8)
    mb = collate(PROMPTS, RESPONSES)
    sink = EntropySink()
    forward_logprobs(model, mb, 0.8, entropy=sink)
    got = {"plain": _values(sink.value, mb.mask)}
    packed = collate_packed(PROMPTS, RESPONSES)
    sink = EntropySink()
    forward_logprobs(model, packed, 0.8, entropy=sink)
    rows, laid = per_sequence(sink.value, packed)
    got["packed"] = _values(rows, laid.mask)
    model.__class__ = type("NotFastPath", (LlamaForCausalLM,), {})  # logits from the model's own forward
    try:
        sink = EntropySink()
        forward_logprobs(model, mb, 0.8, entropy=sink)
        got["full-logits"] = _values(sink.value, mb.mask)
    finally:
        model.__class__ = LlamaForCausalLM
    for layout in ("row", "cache"):
        sink = EntropySink()
        shared_prefix_logprobs(model, PROMPTS, RESPONSES, mb.mask, 0.8, layout=layout, entropy=sink)
        got[layout] = _values(sink.value, mb.mask)
    for name, values in got.items():
        for a, b in zip(values, ref):
            assert a == pytest.approx(b, abs=1e-4), name
    assert all(0 < v < math.log(97) for row in ref for v in row)


def test_the_sink_keeps_a_graph_only_when_asked(model) -> None:
    mb = collate(PROMPTS, RESPONSES)
    metric, bonus = EntropySink(grad=False), EntropySink(grad=True)
    forward_logprobs(model, mb, 1.0, entropy=metric)
    forward_logprobs(model, mb, 1.0, entropy=bonus)
    assert not metric.value.requires_grad and bonus.value.requires_grad
    torch.testing.assert_close(metric.value, bonus.value.detach(), atol=0, rtol=0)
    assert torch.equal(metric.value[~mb.mask], torch.zeros(int((~mb.mask).sum())))


def test_bf16_logits_and_autocast_give_float32_entropy() -> None:
    x = torch.randn(4, 7, 13)
    ref = token_entropy(x)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        h = token_entropy(x.bfloat16(), grad=True)
    assert h.dtype == torch.float32
    torch.testing.assert_close(h, ref, atol=3e-2, rtol=0)  # bf16 rounding of the logits only
