"""Sequence packing (case C11): first-fit-decreasing rows, packed collation, packed logprobs equal to
unpacked ones on tiny random Llama / Qwen2 / Qwen3 / GPT-2 models, one packed Trainer update equal to
one padded update, and the config checks of trainer.micro_batch_tokens.

Run: .venv/bin/python -m pytest tests/unit/test_packing.py -q
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from actors.model.forward import (batch_logprobs, collate, collate_packed, forward_logprobs, per_sequence,
                                  response_values, split_micro_batches)
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.algo.packing import pack_first_fit_decreasing, packed_position_ids, token_occupancy
from orchestrator.config import ConfigError, load_config
from orchestrator.config.schema import AlgoConfig, TrainerConfig

V = 97
CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"


# ---- first-fit decreasing (pure) -------------------------------------------------------------------
def test_ffd_places_longest_first_into_the_first_row_with_room():
    # order 0(5), 3(4), 1(3), 2(2): 5 -> row0 (2 left), 4 -> row1 (3 left), 3 -> row1 (0 left), 2 -> row0
    assert pack_first_fit_decreasing([5, 3, 2, 4], budget=7) == [[0, 2], [3, 1]]
    # 6+4 and 5+3+2 fill two rows of 10 exactly (the optimum); first fit in input order would need 3
    assert pack_first_fit_decreasing([2, 3, 4, 5, 6], budget=10) == [[4, 2], [3, 1, 0]]
    assert pack_first_fit_decreasing([], budget=3) == []
    assert pack_first_fit_decreasing([3, 3], budget=3) == [[0], [1]]


def test_ffd_rows_respect_the_budget_and_hold_every_sequence_once():
    rng = random.Random(0)
    lengths = [rng.randint(1, 50) for _ in range(200)]
    rows = pack_first_fit_decreasing(lengths, budget=64)
    assert sorted(i for r in rows for i in r) == list(range(200))
    assert all(sum(lengths[i] for i in r) <= 64 for r in rows)
    assert len(rows) <= 11 / 9 * (sum(lengths) / 64) + 1  # FFD <= 11/9 OPT + 6/9, OPT >= ceil(sum / budget)


def test_ffd_rejects_a_sequence_longer_than_the_budget():
    with pytest.raises(ValueError, match=r"sequence 1 has 9 tokens.*trainer.micro_batch_tokens=8"):
        pack_first_fit_decreasing([3, 9, 2], budget=8)
    with pytest.raises(ValueError, match="budget"):
        pack_first_fit_decreasing([1], budget=0)
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        pack_first_fit_decreasing([0], budget=4)


def test_position_ids_and_occupancy():
    assert packed_position_ids([4, 3]).tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert packed_position_ids([1, 1, 2]).tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        packed_position_ids([2, 0])
    assert token_occupancy(30, rows=2, budget=16) == pytest.approx(30 / 32)
    with pytest.raises(ValueError):
        token_occupancy(33, rows=2, budget=16)


def test_split_micro_batches_padded_and_packed():
    groups, occ = split_micro_batches([2, 3, 5, 6], micro_batch_size=2)
    assert groups == [[0, 1], [2, 3]] and occ == pytest.approx(16 / (2 * 3 + 2 * 6))
    groups, occ = split_micro_batches([2, 3, 5, 6], micro_batch_size=2, micro_batch_tokens=8)
    assert groups == [[3, 0], [2, 1]] and occ == pytest.approx(1.0)


# ---- C11: packed collation keeps boundaries ----------------------------------------------------------
def test_c11_packed_values_and_position_ids():
    # A = [11, 12, 13, 14], B = [21, 22, 23]: first token as prompt, the rest scored (as the response)
    a_lp, b_lp = [-0.1, -0.2, -0.3], [-0.4, -0.5]
    mb = collate_packed([[11], [21]], [[12, 13, 14], [22, 23]], {"old": [a_lp, b_lp]})
    assert mb.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    # values are in shifted coordinates (position p scores token p + 1); aligned one-to-one with input ids
    aligned = torch.cat([torch.zeros(1), mb.values["old"][0]]).tolist()
    assert aligned == pytest.approx([0, -0.1, -0.2, -0.3, 0, -0.4, -0.5])
    # the boundary (14 "predicting" 21) is never scored
    assert mb.mask.tolist() == [[True, True, True, False, True, True]]
    assert mb.segments == [(0, 3), (4, 2)]
    assert response_values(mb.values["old"], mb) == [pytest.approx(a_lp), pytest.approx(b_lp)]


def _tiny(kind: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, initializer_range=0.3, attn_implementation=attn)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=32, **common)).eval()
    gpt2 = GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=2, n_positions=64, initializer_range=0.3,
                      attn_implementation=attn)
    return GPT2LMHeadModel(gpt2).eval()  # learned absolute positions, not in FAST_PATH_ARCHS


@pytest.mark.parametrize("kind,attn", [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"),
                                       ("qwen3", "sdpa"), ("gpt2", "sdpa")])
def test_c11_packed_logprobs_equal_each_sequence_alone(kind, attn):
    model = _tiny(kind, attn)
    prompts, responses = [[11], [21], [5, 6, 7]], [[12, 13, 14], [22, 23], [8, 9, 10, 11, 12]]
    with torch.no_grad():
        mb = collate_packed(prompts, responses)
        packed = response_values(forward_logprobs(model, mb, temperature=0.7), mb)
        for p, r, got in zip(prompts, responses, packed):
            alone_mb = collate([p], [r])
            alone = response_values(forward_logprobs(model, alone_mb, temperature=0.7), alone_mb)[0]
            assert got == pytest.approx(alone, abs=1e-5)
        # the fault this guards against: one causal mask over the whole row changes B's logprobs
        leaky = collate([[11, 12, 13, 14, 21]], [[22, 23]])
        assert response_values(forward_logprobs(model, leaky, 0.7), leaky)[0] != pytest.approx(packed[1], abs=1e-3)


def test_batch_logprobs_packed_equal_padded():
    model = _tiny("llama")
    rng = random.Random(1)
    prompts = [[rng.randrange(1, V) for _ in range(rng.randint(1, 6))] for _ in range(9)]
    responses = [[rng.randrange(1, V) for _ in range(rng.randint(1, 9))] for _ in range(9)]
    padded = batch_logprobs(model, prompts, responses, 1.0, micro_batch_size=4)
    packed = batch_logprobs(model, prompts, responses, 1.0, micro_batch_size=4, micro_batch_tokens=20)
    assert [len(x) for x in packed] == [len(r) for r in responses]
    for a, b in zip(packed, padded):
        assert a == pytest.approx(b, abs=1e-5)


def test_per_sequence_relays_values_and_gradients():
    mb = collate_packed([[1], [2, 3]], [[4, 5, 6], [7]], {"old": [[-1.0, -2.0, -3.0], [-4.0]]})
    # row [1, 4, 5, 6, 2, 3, 7]; shifted [1, 6]: 0..2 score A's response, 3 is the boundary, 4 scores B's
    # prompt token 3, 5 scores B's response token 7
    t = torch.arange(1.0, 7.0)[None].requires_grad_()
    seq, smb = per_sequence(t, mb)
    assert seq.tolist() == [[1.0, 2.0, 3.0], [6.0, 0.0, 0.0]]
    assert smb.mask.tolist() == [[True, True, True], [True, False, False]]
    assert smb.values["old"].tolist() == [[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]]
    seq.sum().backward()
    assert t.grad.tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0, 1.0]]  # unscored positions get no gradient
    with pytest.raises(ValueError, match=r"t: shape \(1, 5\)"):
        per_sequence(t[:, :5], mb)
    with pytest.raises(ValueError, match="not packed"):
        per_sequence(t, collate([[1]], [[2]]))


# ---- Trainer: one packed update equals one padded update -----------------------------------------
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama_packing")
    _tiny("llama").save_pretrained(folder)
    return folder


def _batch(n=10, seed=0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, V) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    responses = [[rng.randrange(3, V) for _ in range(rng.choice([1, 2, 3, 12]))] for _ in range(n)]
    return TrainBatch.with_sequence_advantages(
        prompts, responses, rollout_logprobs=[[-4.0 + 0.1 * k for k in range(len(r))] for r in responses],
        advantages=[rng.choice([-1.0, 0.5, 1.0]) for _ in range(n)],
        ref_logprobs=[[-3.0] * len(r) for r in responses])


def _trainer(folder, algo_over=None, **over):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32", **over})
    algo = OmegaConf.structured(AlgoConfig)
    algo.update(algo_over or {})
    return Trainer(str(folder), tc, algo, temperature=1.0, max_new_tokens=12)


@pytest.mark.parametrize("algo_over", [{"loss_agg": "token-mean", "kl_coef": 0.1},
                                       {"loss_agg": "seq-mean-token-mean", "old_logprobs": "trainer"},
                                       {"loss_agg": "seq-mean-token-sum-norm"}])
def test_one_packed_update_equals_one_padded_update(tiny_folder, algo_over):
    padded, packed = _trainer(tiny_folder, algo_over), _trainer(tiny_folder, algo_over, packing=True,
                                                                 micro_batch_tokens=24)
    mp, mk = padded.train_step(_batch()), packed.train_step(_batch())
    assert mp["actor/micro_batches"] == 4 and mk["actor/micro_batches"] >= 2  # 10 sequences, 3 per micro-batch
    for key in ("actor/loss", "actor/pg_loss", "actor/kl", "actor/ratio_mean", "actor/logprob_gap_abs"):
        assert mk[key] == pytest.approx(mp[key], rel=1e-5, abs=1e-6), key
    assert mk["actor/grad_norm"] == pytest.approx(mp["actor/grad_norm"], rel=1e-4)
    # the accumulated (clipped) gradients of the update; the weights after Adam's first step are not
    # compared: it moves each weight by about lr * sign(g), so float noise on g ~ 0 flips whole steps
    for (name, a), b in zip(padded.model.named_parameters(), packed.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6), name


def test_packed_trainer_metrics_and_mini_batches(tiny_folder):
    batch = _batch()
    lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
    m = _trainer(tiny_folder, packing=True, micro_batch_tokens=32).train_step(batch)
    rows = len(pack_first_fit_decreasing(lengths, 32))
    assert m["actor/micro_batches"] == rows
    assert m["actor/token_occupancy"] == pytest.approx(sum(lengths) / (rows * 32))
    # two mini-batches with trainer-side old logprobs (batch_logprobs runs packed too)
    two = _trainer(tiny_folder, {"old_logprobs": "trainer"}, packing=True, micro_batch_tokens=32, mini_batches=2)
    assert two.train_step(batch)["actor/ratio_mean"] != pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="trainer.micro_batch_tokens=10"):
        _trainer(tiny_folder, packing=True, micro_batch_tokens=10).train_step(batch)


# ---- config validation ------------------------------------------------------------------------------
def test_config_rejects_a_budget_below_one():
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_tokens=0 must be >= 1"):
        load_config(CPU_YAML, ["trainer.micro_batch_tokens=0"])


def test_config_rejects_a_packed_budget_shorter_than_the_longest_sequence():
    cfg = load_config(CPU_YAML, [])
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    both_keys = r"trainer.micro_batch_tokens.*data.max_prompt_tokens \+ rollout.max_new_tokens"
    with pytest.raises(ConfigError, match=both_keys):
        load_config(CPU_YAML, ["trainer.packing=true", f"trainer.micro_batch_tokens={longest - 1}"])
    ok = load_config(CPU_YAML, ["trainer.packing=true", f"trainer.micro_batch_tokens={longest}"])
    assert ok.trainer.packing and ok.trainer.micro_batch_tokens == longest
    # without packing the budget is unused and not checked against the sequence length
    assert load_config(CPU_YAML, [f"trainer.micro_batch_tokens={longest - 1}"]).trainer.packing is False


def test_reference_scores_packed_rows_like_padded_ones(tiny_folder):
    from actors.reference import Reference
    b = _batch(seed=3)
    padded = Reference(str(tiny_folder), 1.0, micro_batch_size=3, num_threads=1)
    packed = Reference(str(tiny_folder), 1.0, micro_batch_size=3, num_threads=1, micro_batch_tokens=24)
    for x, y in zip(packed.logprobs(b.prompt_ids, b.response_ids),
                    padded.logprobs(b.prompt_ids, b.response_ids)):
        assert x == pytest.approx(y, abs=1e-5)
