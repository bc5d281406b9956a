"""Trainer memory features on tiny random models (no Ray): gradient checkpointing gives the same update,
and a mixture-of-experts policy (Qwen3-MoE, 2 layers, 4 experts, top-2) adds the router load-balancing
loss over real tokens only (case C12) and reports expert load."""
from __future__ import annotations

import random

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from actors.model.forward import collate
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.algo.moe import load_balancing_loss
from orchestrator.config.schema import AlgoConfig, TrainerConfig


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("tiny_llama_gc")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=97, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, initializer_range=0.3, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("tiny_qwen3_moe")
    Qwen3MoeForCausalLM(cfg).save_pretrained(folder)
    return folder


def _batch(n=6, seed=0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 97) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    responses = [[rng.randrange(3, 97) for _ in range(rng.randint(1, 7))] for _ in range(n)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses],
                                               [rng.choice([-1.0, 1.0]) for _ in range(n)], ref_logprobs=None)


def _trainer(folder, pad_id=0, **over):
    tc = OmegaConf.structured(TrainerConfig)
    base = {"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32"}
    tc = OmegaConf.merge(tc, {**base, **over})
    return Trainer(str(folder), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8,
                   pad_id=pad_id)


def test_gradient_checkpointing_gives_the_same_update(llama):
    plain, ckpt = _trainer(llama), _trainer(llama, gradient_checkpointing=True)
    assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    mp, mc = plain.train_step(_batch()), ckpt.train_step(_batch())
    assert mc["actor/loss"] == pytest.approx(mp["actor/loss"], abs=1e-6)
    assert mc["actor/grad_norm"] == pytest.approx(mp["actor/grad_norm"], rel=1e-5)
    for (name, a), b in zip(plain.model.named_parameters(), ckpt.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_gradient_checkpointing_with_lora_trains_the_adapters(llama):
    t = _trainer(llama, gradient_checkpointing=True, **{"lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0,
                                                                 "target_modules": ["q_proj", "v_proj"]}})
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    t.train_step(_batch())
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if ".lora_B." in n)


def _independent_aux(folder, batch, pad_id, masked=True):
    """The aux loss of the whole batch as one padded micro-batch, from a fresh copy of the model."""
    model = Qwen3MoeForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    mb = collate(batch.prompt_ids, batch.response_ids, pad_id=pad_id)
    with torch.no_grad():
        out = model.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, output_router_logits=True)
    return float(load_balancing_loss(out.router_logits, 2, mb.attention_mask if masked else None))


def test_moe_aux_loss_and_expert_load_metrics(moe):
    batch = _batch()
    m = _trainer(moe, micro_batch_size=len(batch), router_aux_loss_coef=0.5).train_step(batch)
    expected = _independent_aux(moe, batch, pad_id=0)
    assert m["actor/router_aux_loss"] == pytest.approx(expected, rel=1e-5)
    assert 2.0 <= m["actor/router_aux_loss"] < 4.0  # top-2 of 4: 2 when balanced, 4 at most
    assert 1.0 <= m["moe/expert_load_max"] <= 4.0 and m["moe/expert_load_cv"] >= 0.0
    # the loss minimised is policy loss + coef * aux: compare with coef 0 on the same initial model
    m0 = _trainer(moe, micro_batch_size=len(batch), router_aux_loss_coef=0.0).train_step(batch)
    assert m["actor/loss"] - m0["actor/loss"] == pytest.approx(0.5 * expected, rel=1e-4)
    assert m0["actor/router_aux_loss"] == pytest.approx(expected, rel=1e-5)  # still reported at coef 0


def test_moe_aux_loss_ignores_padding_tokens(moe):
    batch = _batch()
    n = len(batch)
    a = _trainer(moe, pad_id=0, micro_batch_size=n).train_step(batch)
    b = _trainer(moe, pad_id=50, micro_batch_size=n).train_step(batch)
    assert a["actor/router_aux_loss"] == pytest.approx(b["actor/router_aux_loss"], rel=1e-6)
    assert a["moe/expert_load_max"] == b["moe/expert_load_max"]
    # one packed row of the same sequences (no padding at all, trainer.packing) gives the same value
    packed = _trainer(moe, packing=True, micro_batch_tokens=200).train_step(batch)
    assert packed["actor/router_aux_loss"] == pytest.approx(a["actor/router_aux_loss"], rel=1e-5)
    # the fault C12 guards against: counting the pads makes the value depend on the pad token
    assert _independent_aux(moe, batch, 0, masked=False) != pytest.approx(
        _independent_aux(moe, batch, 50, masked=False), rel=1e-4)


def test_router_aux_coefficient_moves_the_router(moe):
    batch = _batch(seed=4)
    gates = []
    for coef in (0.0, 1.0):
        t = _trainer(moe, router_aux_loss_coef=coef)
        t.train_step(batch)
        gates.append(t.model.model.layers[0].mlp.gate.weight.detach().clone())
    assert not torch.allclose(gates[0], gates[1], atol=1e-6)


def test_dense_model_reports_no_moe_metrics(llama):
    m = _trainer(llama).train_step(_batch())
    assert not any(k.startswith("moe/") or k == "actor/router_aux_loss" for k in m)
