"""Unit tests of orchestrator.algo.logprobs, including cases C03 (temperature) and C10 (position ids)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.algo import position_ids_from_attention_mask, token_logprobs
from orchestrator.algo import logprobs as logprobs_module


def test_c03_large_vocab_temperature() -> None:
    logits = torch.zeros(1, 1, 1000)
    logits[0, 0, 0] = 5.0
    tokens = torch.zeros(1, 1, dtype=torch.int64)
    trainer = token_logprobs(logits, tokens, temperature=0.6)
    assert trainer.item() == pytest.approx(-0.215215, abs=1e-5)
    # The sampler draws from softmax(logits / T); its logprob of the sampled token is the same.
    sampler = torch.distributions.Categorical(logits=logits[0, 0] / 0.6).log_prob(torch.tensor(0))
    assert torch.exp(trainer[0, 0] - sampler).item() == pytest.approx(1.0, abs=1e-6)
    # The faults: raw logprob, or raw logprob divided by T.
    raw = token_logprobs(logits, tokens, temperature=1.0).item()
    assert raw == pytest.approx(-2.045265, abs=1e-5)
    assert raw / 0.6 == pytest.approx(-3.408775, abs=1e-5)
    assert trainer.item() != pytest.approx(raw, abs=1e-3)


def test_c03_small_form() -> None:
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0]]])
    tokens = torch.zeros(1, 1, dtype=torch.int64)
    assert token_logprobs(logits, tokens, 0.6).item() == pytest.approx(-0.245060, abs=1e-5)
    assert token_logprobs(logits, tokens).item() == pytest.approx(-0.495182, abs=1e-5)


def test_matches_log_softmax_gather_and_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 50, generator=gen, requires_grad=True)
    tokens = torch.randint(0, 50, (3, 5), generator=gen)
    out = token_logprobs(logits, tokens, temperature=0.7)
    ref = F.log_softmax(logits / 0.7, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(out, ref)
    (g_out,) = torch.autograd.grad(out.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g_out, g_ref)


def test_chunking_over_rows_gives_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 4, 30, generator=gen).to(torch.bfloat16)
    tokens = torch.randint(0, 30, (5, 4), generator=gen)
    whole = token_logprobs(logits, tokens)
    monkeypatch.setattr(logprobs_module, "_MAX_CHUNK_ELEMENTS", 2 * 4 * 30)  # 2 rows per chunk
    chunked = token_logprobs(logits, tokens)
    assert whole.dtype == chunked.dtype == torch.float32
    assert torch.equal(whole, chunked)
    ref = F.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(whole, ref)


@pytest.mark.parametrize(
    ("logits", "tokens", "temperature", "match"),
    [
        (torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.int64), 0.0, "temperature"),
        (torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.int64), -1.0, "temperature"),
        (torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.int64), 1.0, "tokens"),
        (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), 1.0, "logits"),
        (torch.zeros(1, 2, 3), torch.zeros(1, 2), 1.0, "tokens"),
    ],
)
def test_token_logprobs_errors(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        token_logprobs(logits, tokens, temperature)


def test_c10_position_ids_left_and_right_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    pos = position_ids_from_attention_mask(mask)
    assert pos.dtype == torch.int64
    assert pos.tolist() == [[1, 1, 0, 1, 2], [0, 1, 2, 1, 1], [0, 1, 2, 3, 4]]
    assert torch.equal(position_ids_from_attention_mask(mask.bool()), pos)
    with pytest.raises(ValueError, match="attention_mask"):
        position_ids_from_attention_mask(torch.ones(5))


class _TinyCausalLM(torch.nn.Module):
    """One attention layer with learned absolute positions: logits depend on the position ids."""

    def __init__(self, vocab: int = 17, dim: int = 16, max_pos: int = 16) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_pos, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        h = self.tok(ids) + self.pos(position_ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        seq = ids.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        keys = attention_mask.bool()[:, None, :] | torch.eye(seq, dtype=torch.bool)  # pads see themselves
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & keys)
        return self.head(h + attn)


def _sequence_logprobs(
    model: _TinyCausalLM, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    logits = model(ids, mask, pos)
    return token_logprobs(logits[:, :-1], ids[:, 1:], temperature=0.8)


def test_c10_logprobs_do_not_depend_on_left_padding() -> None:
    torch.manual_seed(0)
    model = _TinyCausalLM()
    seq = torch.tensor([[3, 7, 1, 9, 4]])
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.int64), seq], dim=1)
    mask_plain, mask_padded = torch.ones(1, 5), torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    plain = _sequence_logprobs(model, seq, mask_plain, position_ids_from_attention_mask(mask_plain))
    left = _sequence_logprobs(model, padded, mask_padded, position_ids_from_attention_mask(mask_padded))
    torch.testing.assert_close(left[:, 2:], plain, atol=1e-5, rtol=0)
    # The fault: positions counted from the start of the padded row shift every real token.
    naive = _sequence_logprobs(model, padded, mask_padded, torch.arange(7)[None])
    assert (naive[:, 2:] - plain).abs().max().item() > 1e-3
