"""Multi-turn loss mask in the trainer: observation ids inside the response are never trained.

A multi-turn response is sampled ids (mask 1) and observation/template ids (mask 0, logprob 0.0)
in between (orchestrator/rollout/multiturn.py). `collate` + `apply_loss_mask` must drop the
observation positions from `mask`, and the update must equal the hand-written policy gradient over
the sampled ids only, whatever the observation ids' rollout logprobs are.
"""
from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from actors.model.forward import LOSS_MASK, apply_loss_mask, collate, collate_packed, forward_logprobs, per_sequence
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.config.schema import AlgoConfig, TrainerConfig


def test_collate_with_loss_mask_drops_observation_positions():
    # prompt [5, 6], response [7, 8, 9, 10]: sampled 7, observation 8 9, sampled 10 -> mask [1, 0, 0, 1]
    # shifted coordinates: response token k of a 2-token prompt sits at position 1 + k
    mb = collate([[5, 6]], [[7, 8, 9, 10]], {"rollout": [[-0.5, 0.0, 0.0, -0.25]], LOSS_MASK: [[1, 0, 0, 1]]})
    assert mb.mask[0].tolist() == [False, True, True, True, True]
    masked = apply_loss_mask(mb)
    assert masked.mask[0].tolist() == [False, True, False, False, True]
    assert masked.values["rollout"][0][masked.mask[0]].tolist() == [-0.5, -0.25]  # logprobs align with trained ids
    assert apply_loss_mask(collate([[5, 6]], [[7, 8]])).mask[0].tolist() == [False, True, True]  # no mask: unchanged


def test_packed_row_keeps_the_loss_mask_per_sequence():
    # A = [1, 2 | 3, 4, 5] mask [1, 0, 1]; B = [6 | 7, 8] mask [0, 1]
    mb = collate_packed([[1, 2], [6]], [[3, 4, 5], [7, 8]], {LOSS_MASK: [[1, 0, 1], [0, 1]]})
    t = torch.arange(mb.mask.shape[1], dtype=torch.float32)[None]
    _, seq = per_sequence(t, mb)
    assert apply_loss_mask(seq).mask.tolist() == [[True, False, True], [False, True, False]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True, initializer_range=0.3)
    folder = tmp_path_factory.mktemp("tiny_mt")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
RESPONSES = [[12, 13, 14, 15, 16, 17], [18, 19, 20, 21], [22, 23, 24, 25, 26]]
MASKS = [[1, 1, 0, 0, 1, 1], [1, 0, 0, 1], [1, 1, 1, 0, 1]]  # 0 = observation / template ids
ADV = [1.0, -1.0, 0.5]


def _trainer(tiny, packing=False):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-2, "warmup_steps": 0, "micro_batch_size": 2, "num_threads": 1, "precision": "fp32",
               "grad_clip": 0.0, "packing": packing, "micro_batch_tokens": 16})
    algo = OmegaConf.structured(AlgoConfig)
    algo.tis_cap = 2.0
    return Trainer(str(tiny), tc, algo, temperature=1.0, max_new_tokens=8)


def _batch(observation_logprob: float, masks=MASKS):
    rollout = [[(-1.5 if m else observation_logprob) for m in mask] for mask in MASKS]
    return TrainBatch.with_sequence_advantages(PROMPTS, RESPONSES, rollout, ADV, ref_logprobs=None,
                                               response_mask=masks)


def _grads(trainer) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("packing", [False, True])
def test_update_ignores_observation_ids(tiny, packing):
    a, b = _trainer(tiny, packing), _trainer(tiny, packing)
    reference = copy.deepcopy(a.model)
    ma = a.train_step(_batch(0.0))
    mb = b.train_step(_batch(-7.0))  # observation ids' rollout logprobs must not matter
    for ga, gb in zip(_grads(a), _grads(b)):
        assert torch.equal(ga, gb)
    assert ma["actor/loss"] == mb["actor/loss"]
    # hand-written policy gradient over sampled ids only (old = current policy, so ratio = 1;
    # TIS weight min(exp(lp - rollout_lp), 2)): loss = -sum_trained A_i * w * lp / N_trained (token-mean)
    n_trained = sum(map(sum, MASKS))
    loss = 0.0
    for p, r, m, adv in zip(PROMPTS, RESPONSES, MASKS, ADV):
        one = collate([p], [r])
        lp = forward_logprobs(reference, one, 1.0)[0][one.mask[0]]
        keep = torch.tensor(m, dtype=torch.bool)
        w = torch.clamp(torch.exp(lp.detach() - torch.tensor(-1.5)), max=2.0)
        loss = loss - (adv * w * torch.exp(lp - lp.detach()))[keep].sum() / n_trained
    loss.backward()
    for got, p in zip(_grads(a), reference.parameters()):
        assert torch.allclose(got, p.grad, atol=1e-6, rtol=1e-4)


def test_without_the_mask_observation_logprobs_would_change_the_update(tiny):
    # the check above is sensitive: with every id trained, the observation ids' rollout logprobs enter TIS
    a, b = _trainer(tiny), _trainer(tiny)
    a.train_step(_batch(0.0, masks=None))
    b.train_step(_batch(-7.0, masks=None))
    assert any(not torch.equal(ga, gb) for ga, gb in zip(_grads(a), _grads(b)))
