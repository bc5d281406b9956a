"""Unit tests of actors.model.forward (plain torch, a tiny random Llama): collate, forward_logprobs (including
case C10, left padding), response_values and batch_logprobs."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from actors.model.forward import (MicroBatch, autocast_context, batch_logprobs, collate, forward_logprobs,
                                  response_values)
from orchestrator.algo import position_ids_from_attention_mask

V = 97


def _llama(attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(0)
    # initializer_range 0.3 (default 0.02) so that logits are far from uniform and errors show.
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                      initializer_range=0.3, attn_implementation=attn_implementation)
    return LlamaForCausalLM(cfg).float().eval()


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return _llama()


def _samples(seed: int = 0, n: int = 7) -> tuple[list[list[int]], list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(n):
        lp, lr = 2 + (3 * i) % 7, 1 + (5 * i) % 6
        prompts.append(torch.randint(1, V, (lp,), generator=gen).tolist())
        responses.append(torch.randint(1, V, (lr,), generator=gen).tolist())
    return prompts, responses


# --------------------------------------------------------------------------- collate


def test_collate_hand_example() -> None:
    mb = collate([[1, 2, 3], [4]], [[6, 7], [8, 9]], per_token={"ref": [[-0.5, -0.25], [-1.0, -2.0]]}, pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 6, 7], [4, 8, 9, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert mb.targets.tolist() == [[2, 3, 6, 7], [8, 9, 0, 0]]
    assert mb.mask.tolist() == [[False, False, True, True], [True, True, False, False]]
    assert mb.values["ref"].tolist() == [[0.0, 0.0, -0.5, -0.25], [-1.0, -2.0, 0.0, 0.0]]
    assert mb.input_ids.dtype == mb.attention_mask.dtype == mb.targets.dtype == torch.int64
    assert mb.mask.dtype == torch.bool and mb.values["ref"].dtype == torch.float32
    # the targets on mask positions are exactly the response tokens
    assert [mb.targets[i][mb.mask[i]].tolist() for i in range(2)] == [[6, 7], [8, 9]]


def test_collate_pad_id_and_shapes() -> None:
    mb = collate([[5, 5], [6]], [[7], [8, 8, 8, 8]], pad_id=2)
    assert mb.input_ids.shape == (2, 5) and mb.targets.shape == mb.mask.shape == (2, 4)
    assert mb.input_ids.tolist() == [[5, 5, 7, 2, 2], [6, 8, 8, 8, 8]]
    assert mb.mask.tolist() == [[False, True, False, False], [True, True, True, True]]
    assert mb.values == {}


def test_collate_errors() -> None:
    with pytest.raises(ValueError, match="sample 1 has an empty response"):
        collate([[1, 2], [3]], [[4], []])
    with pytest.raises(ValueError, match="sample 0 has an empty prompt"):
        collate([[], [3]], [[4, 5], [6]])
    with pytest.raises(ValueError, match="ref of sample 1 has 1 values for 2 response tokens"):
        collate([[1], [2]], [[3], [4, 5]], per_token={"ref": [[0.1], [0.2]]})
    with pytest.raises(ValueError, match="got 2 prompts and 1 responses"):
        collate([[1], [2]], [[3]])
    with pytest.raises(ValueError, match="got 0 prompts"):
        collate([], [])


# --------------------------------------------------------------------------- forward_logprobs


def _reference_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(full logits / T) of the response tokens, one unpadded sequence at a time."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    lp = F.log_softmax(logits / temperature, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(prompt) - 1:]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_logprobs_matches_full_log_softmax(model, temperature: float) -> None:
    prompts, responses = _samples(seed=1, n=5)
    mb = collate(prompts, responses, pad_id=0)
    with torch.no_grad():
        out = forward_logprobs(model, mb, temperature)
    assert out.shape == mb.mask.shape and out.dtype == torch.float32
    assert torch.all(out[~mb.mask] == 0.0)
    assert torch.all(out[mb.mask] < 0.0)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        expected = _reference_logprobs(model, p, r, temperature)
        torch.testing.assert_close(out[i][mb.mask[i]], expected, atol=1e-5, rtol=0)
    # the logprobs are not near uniform (a weak test would pass with any positions)
    assert (out[mb.mask] + torch.log(torch.tensor(float(V)))).abs().max() > 1.0


def test_forward_logprobs_full_forward_path_agrees(model, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts, responses = _samples(seed=2, n=4)
    mb = collate(prompts, responses)
    with torch.no_grad():
        fast = forward_logprobs(model, mb, 0.8)
        monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)  # Llama ignores it
        full = forward_logprobs(model, mb, 0.8)
    assert torch.all(full[~mb.mask] == 0.0)
    torch.testing.assert_close(full, fast, atol=1e-5, rtol=0)


def test_forward_logprobs_has_gradients(model) -> None:
    mb = collate([[3, 4, 5]], [[6, 7]])
    out = forward_logprobs(model, mb, 1.0)
    out.sum().backward()
    grad = model.get_output_embeddings().weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def _left_pad(mb: MicroBatch, pads: int, pad_id: int = 0) -> MicroBatch:
    """The same micro-batch with `pads` pad tokens on the left, built by hand."""
    b = mb.input_ids.shape[0]
    input_ids = torch.cat([torch.full((b, pads), pad_id, dtype=torch.long), mb.input_ids], dim=1)
    attention_mask = torch.cat([torch.zeros((b, pads), dtype=torch.long), mb.attention_mask], dim=1)
    mask = torch.cat([torch.zeros((b, pads), dtype=torch.bool), mb.mask], dim=1)
    return MicroBatch(input_ids, attention_mask, input_ids[:, 1:], mask, {})


def test_c10_position_ids_of_the_hand_built_batch() -> None:
    mb = _left_pad(collate([[11, 12]], [[13]]), pads=2)
    assert mb.input_ids.tolist() == [[0, 0, 11, 12, 13]]
    assert mb.attention_mask.tolist() == [[0, 0, 1, 1, 1]]
    assert mb.mask.tolist() == [[False, False, False, True]]
    assert position_ids_from_attention_mask(mb.attention_mask).tolist() == [[1, 1, 0, 1, 2]]


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_c10_left_padding_gives_the_same_logprobs(attn_implementation: str) -> None:
    model = _llama(attn_implementation)
    mb = collate([[5, 17, 33, 2]], [[41, 8, 90, 61, 12]])
    padded = _left_pad(mb, pads=2, pad_id=7)
    assert padded.attention_mask[0, :3].tolist() == [0, 0, 1]
    with torch.no_grad():
        plain = forward_logprobs(model, mb, 0.9)
        left = forward_logprobs(model, padded, 0.9)
    assert left.shape == (1, plain.shape[1] + 2)
    torch.testing.assert_close(left[padded.mask], plain[mb.mask], atol=1e-5, rtol=0)
    assert torch.all(left[:, :2] == 0.0)
    torch.testing.assert_close(response_values(left, padded), response_values(plain, mb), atol=1e-5, rtol=0)


def test_c10_left_padding_in_a_mixed_batch(model) -> None:
    """Two samples with different left padding in one batch, against each sample alone."""
    prompts, responses = [[4, 5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14, 15]]
    alone = [forward_logprobs(model, collate([p], [r]), 1.0) for p, r in zip(prompts, responses)]
    # left-pad both to length 8 (the vLLM / HF generate layout): 2 pads and 2 pads
    seqs = [p + r for p, r in zip(prompts, responses)]
    L = 8
    input_ids = torch.tensor([[0] * (L - len(s)) + s for s in seqs])
    attention_mask = torch.tensor([[0] * (L - len(s)) + [1] * len(s) for s in seqs])
    mask = torch.zeros((2, L - 1), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        start = L - len(seqs[i]) + len(p) - 1
        mask[i, start:start + len(r)] = True
    mb = MicroBatch(input_ids, attention_mask, input_ids[:, 1:], mask, {})
    with torch.no_grad():
        out = forward_logprobs(model, mb, 1.0)
    for i in range(2):
        assert mb.targets[i][mb.mask[i]].tolist() == responses[i]
        torch.testing.assert_close(out[i][mb.mask[i]], alone[i][0][alone[i][0] != 0], atol=1e-5, rtol=0)


def test_c10_fault_shows_with_absolute_positions() -> None:
    """With learned absolute positions (GPT-2) the fault is visible: default position ids 0..L-1 on a
    left-padded row change the logprobs, the mask-derived ones do not. (RoPE models such as Llama are
    invariant to a uniform shift of positions, so they cannot tell the two apart.)"""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=2, n_positions=32, initializer_range=0.3,
                     bos_token_id=0, eos_token_id=0)
    gpt2 = GPT2LMHeadModel(cfg).float().eval()
    mb = collate([[5, 17, 33, 2]], [[41, 8, 90, 61, 12]])
    padded = _left_pad(mb, pads=2)
    with torch.no_grad():
        plain = forward_logprobs(gpt2, mb, 1.0)[mb.mask]
        left = forward_logprobs(gpt2, padded, 1.0)[padded.mask]
        logits = gpt2(input_ids=padded.input_ids, attention_mask=padded.attention_mask,
                      position_ids=torch.arange(padded.input_ids.shape[1])[None]).logits[:, :-1]
    wrong = F.log_softmax(logits, dim=-1).gather(-1, padded.targets[..., None])[..., 0][padded.mask]
    torch.testing.assert_close(left, plain, atol=1e-5, rtol=0)
    assert (wrong - plain).abs().max() > 1e-3


# --------------------------------------------------------------------------- response_values, batch_logprobs


def test_response_values_inverts_the_scatter() -> None:
    prompts, responses = _samples(seed=3, n=6)
    values = [[-(j + 1) / 8 - i for j in range(len(r))] for i, r in enumerate(responses)]  # exact in fp32
    mb = collate(prompts, responses, per_token={"rollout_logprobs": values})
    assert response_values(mb.values["rollout_logprobs"], mb) == values
    assert response_values(mb.targets, mb) == responses


def test_batch_logprobs_independent_of_micro_batch_size(model) -> None:
    prompts, responses = _samples(seed=4, n=7)
    one = batch_logprobs(model, prompts, responses, 0.7, micro_batch_size=1)
    three = batch_logprobs(model, prompts, responses, 0.7, micro_batch_size=3)
    all_ = batch_logprobs(model, prompts, responses, 0.7, micro_batch_size=16)
    assert [len(x) for x in one] == [len(r) for r in responses]
    for a, b, c in zip(one, three, all_):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(a), torch.tensor(c), atol=1e-5, rtol=0)
    # and they are the reference values
    for p, r, got in zip(prompts, responses, three):
        torch.testing.assert_close(torch.tensor(got), _reference_logprobs(model, p, r, 0.7), atol=1e-5, rtol=0)


def test_batch_logprobs_does_not_build_a_graph(model) -> None:
    out = batch_logprobs(model, [[1, 2]], [[3, 4]], 1.0, micro_batch_size=1)
    assert isinstance(out[0][0], float)
    assert model.get_output_embeddings().weight.grad is None


def test_autocast_follows_the_models_device_not_the_host(monkeypatch):
    """A CPU model on a GPU host (an H200 showed it: the planner's activation test measured fp32 activations under
    bf16-autocast) gets CPU autocast; fp32 gets none; fp8 autocasts the rest of the model only on a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    with autocast_context("bf16-autocast", torch.device("cpu")):
        assert (a @ b).dtype == torch.bfloat16
    for precision in ("fp32", "fp8"):
        with autocast_context(precision, "cpu"):
            assert (a @ b).dtype == torch.float32
    monkeypatch.undo()  # torch.autocast("cuda") asks the real CUDA state (it only warns on a host without CUDA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = autocast_context("fp8", "cuda:0")
    assert isinstance(ctx, torch.autocast) and ctx.device == "cuda" and ctx.fast_dtype == torch.bfloat16
