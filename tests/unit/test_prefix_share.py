"""The GRPO shared-prompt forward (actors/model/prefix_share.py, `trainer.shared_prefix`) on a tiny random Llama:
the same per-token logprobs, loss, gradients, updates and reference logprobs as the plain prompt+response
forward (fp32), fewer tokens through the decoder, and the documented fallbacks."""
from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM

from actors.model import prefix_share
from actors.model.forward import collate, forward_logprobs
from actors.reference import Reference
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import save_tiny_llama

# three prompts of different lengths (A and A2 have identical ids but are two rollout groups, case C04),
# samples interleaved as a controller may deliver them, responses of 1-7 ids
A, B, C = [5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]
PROMPTS = [A, B, A, C, B, A, C, A, B, C, A, A]
GROUPS = [0, 1, 0, 2, 1, 0, 2, 3, 1, 2, 3, 3]  # rollout group ids (A twice: groups 0 and 3)


def _responses(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 97) for _ in range(rng.randint(1, 7))] for _ in PROMPTS]


def _batch(seed: int = 0, response_mask: bool = False) -> TrainBatch:
    rng = random.Random(seed + 100)
    responses = _responses(seed)
    rollout = [[rng.uniform(-6.0, -2.0) for _ in r] for r in responses]
    advantages = [rng.choice([-1.0, 0.5, 1.0]) for _ in responses]
    mask = None
    if response_mask:  # multi-turn: some response ids are observations (never trained)
        mask = [[int(k == 0 or rng.random() < 0.6) for k in range(len(r))] for r in responses]
    return TrainBatch.with_sequence_advantages([list(p) for p in PROMPTS], responses, rollout, advantages,
                                               ref_logprobs=None, response_mask=mask)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_prefix"))


@pytest.fixture(scope="module")
def model(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)


def _trainer(tiny, shared: bool, algo=None, **over):
    tc = OmegaConf.structured(TrainerConfig)
    tc = OmegaConf.merge(tc, {"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 5, "num_threads": 1,
                              "precision": "fp32", "shared_prefix": shared, **over})
    return Trainer(str(tiny), tc, algo or OmegaConf.structured(AlgoConfig), temperature=0.7, max_new_tokens=8)


@pytest.fixture
def shared_calls(monkeypatch):
    """Counts calls of the shared-prompt forward, so an equality test cannot compare the plain path with itself."""
    calls = []
    real = prefix_share.shared_prefix_logprobs

    def counted(*args, **kw):
        calls.append(len(args[1]))
        return real(*args, **kw)

    monkeypatch.setattr(prefix_share, "shared_prefix_logprobs", counted)
    return calls


# ---- pure helpers -------------------------------------------------------------------------------
def test_distinct_prompts_and_order():
    uniq, inv = prefix_share.distinct_prompts([[1, 2], [3], [1, 2], [3], [4]])
    assert uniq == [[1, 2], [3], [4]] and inv == [0, 1, 0, 1, 2]
    assert prefix_share.worth_sharing([[1], [2], [1]]) and not prefix_share.worth_sharing([[1], [2], [1, 2]])
    # groups by (mean prompt + response length, first appearance), each group's samples by response length
    prompts = [[1, 2], [3], [1, 2], [3], [4]]
    responses = [[0] * 5, [0] * 2, [0] * 1, [0] * 4, [0] * 3]
    assert prefix_share.order_by_prompt(prompts, responses, [0, 1, 2, 3, 4]) == [1, 3, 4, 2, 0]
    # distinct prompts (groups of one): the plain length sort, so padded micro-batches pad little (ordering
    # by prompt length first had made the packing benchmark's padded micro-batches 80% real instead of 96%)
    prompts = [[5] * 9, [6] * 2, [7] * 5, [8] * 2]
    responses = [[0] * 1, [0] * 20, [0] * 2, [0] * 3]
    assert prefix_share.order_by_prompt(prompts, responses, [0, 1, 2, 3]) == [3, 2, 0, 1]


# ---- logprobs and gradients of one micro-batch -------------------------------------------------
@pytest.fixture(scope="module")
def eager_model(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="eager")


@pytest.mark.parametrize("layout, attn", [("row", "sdpa"), ("cache", "sdpa"), ("row", "eager"), ("auto", "sdpa")])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_equal_the_plain_forward(model, eager_model, temperature, layout, attn):
    model = model if attn == "sdpa" else eager_model
    assert model.config._attn_implementation == attn
    responses = _responses()
    mb = collate(PROMPTS, responses)
    plain = forward_logprobs(model, mb, temperature)
    shared = prefix_share.shared_prefix_logprobs(model, PROMPTS, responses, mb.mask, temperature, layout=layout)
    assert shared.shape == plain.shape and shared.dtype == torch.float32
    assert torch.equal(shared == 0, plain == 0)  # same layout: zero off the response positions
    assert torch.allclose(shared, plain, atol=1e-5, rtol=0)
    assert plain[mb.mask].abs().min() > 0.1  # real values compared, not zeros


@pytest.mark.parametrize("layout, attn", [("row", "sdpa"), ("cache", "sdpa"), ("row", "eager")])
def test_loss_and_every_gradient_equal_the_plain_forward(model, eager_model, layout, attn):
    model = model if attn == "sdpa" else eager_model
    responses = _responses(seed=3)
    mb = collate(PROMPTS, responses)
    weights = torch.randn(mb.mask.shape, generator=torch.Generator().manual_seed(0))
    grads, losses = [], []
    for fn in (lambda m: forward_logprobs(m, mb, 0.8),
               lambda m: prefix_share.shared_prefix_logprobs(m, PROMPTS, responses, mb.mask, 0.8, layout=layout)):
        m = copy.deepcopy(model)
        loss = (fn(m) * weights)[mb.mask].sum() / mb.mask.sum()
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, atol=1e-6, rtol=1e-4), n
        assert g.abs().max() > 0, n  # every parameter gets a gradient through both paths


@pytest.mark.parametrize("layout", ["cache", "row"])
def test_prompt_runs_once_per_micro_batch(model, layout):
    responses = _responses()
    seen, heads = [], []
    handle = model.get_input_embeddings().register_forward_hook(lambda mod, inp, out: seen.append(inp[0].numel()))
    head = model.get_output_embeddings().register_forward_hook(lambda mod, inp, out: heads.append(inp[0].shape))
    try:
        mb = collate(PROMPTS, responses)
        prefix_share.shared_prefix_logprobs(model, PROMPTS, responses, mb.mask, 1.0, layout=layout)
    finally:
        handle.remove()
        head.remove()
    if layout == "cache":  # 3 distinct prompts right-padded to 7, then 12 responses right-padded to the longest
        assert seen == [3 * 7, len(PROMPTS) * max(map(len, responses))]
    else:  # one row: the 3 distinct prompts (7 + 2 + 4 ids) and every response, no padding
        assert seen == [7 + 2 + 4 + sum(map(len, responses))]
    # the LM head sees the response-scoring hidden states only (one per response token)
    assert heads == [torch.Size([sum(map(len, responses)), model.config.hidden_size])]


def test_row_layout_and_mask_by_hand():
    # prompts P0 = [1, 2], P1 = [3]; samples 0 and 2 have P0, sample 1 has P1
    lay = prefix_share.row_layout([[1, 2], [3]], [0, 1, 0], [[4, 5], [6], [7]])
    assert lay["ids"].tolist() == [1, 2, 4, 5, 7, 3, 6]  # P0, its responses (samples 0, 2), P1, sample 1
    assert lay["position_ids"].tolist() == [0, 1, 2, 3, 2, 0, 1]
    assert lay["prompt"].tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert lay["sample"].tolist() == [-1, -1, 0, 0, 2, -1, 1]
    # samples in input order: 4 scored by P0's last token (row 1), 5 by 4 (row 2), 6 by P1 (row 5), 7 by row 1
    assert lay["score"].tolist() == [1, 2, 5, 1] and lay["targets"].tolist() == [4, 5, 6, 7]
    keep = prefix_share.row_mask(lay["prompt"], lay["sample"]).int().tolist()
    assert keep == [[1, 0, 0, 0, 0, 0, 0],
                    [1, 1, 0, 0, 0, 0, 0],
                    [1, 1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 0, 0, 0],
                    [1, 1, 0, 0, 1, 0, 0],  # sample 2 sees P0 and itself, not sample 0
                    [0, 0, 0, 0, 0, 1, 0],  # P1 sees nothing of P0's block
                    [0, 0, 0, 0, 0, 1, 1]]


def test_choose_layout_by_flops():
    # SmolLM2-135M's dims: per token 2 * (2*576*12*64 + 3*576*1536) = 7,077,888 FLOPs, per pair 4*9*64 = 2304
    smol = SimpleNamespace(_attn_implementation="sdpa", hidden_size=576, num_attention_heads=9,
                           num_key_value_heads=3, head_dim=64, intermediate_size=1536)
    demo = [15, 20, 25, 30, 35, 40, 45, 48]  # T = 49 + 258 = 307
    # row: 307 * 7,077,888 + 307^2 * 2304 = 2.39e9 < cache: 433 * 7,077,888 + (49^2 + 8*48*97) * 2304 = 3.16e9
    assert prefix_share.choose_layout(smol, [49], demo) == "row"
    # 8 x 2048-token responses: row 16896 tokens but 16896^2 pairs (7.8e11) > cache (2.2e11)
    assert prefix_share.choose_layout(smol, [512], [2048] * 8) == "cache"
    flash = SimpleNamespace(**{**vars(smol), "_attn_implementation": "flash_attention_2"})
    assert prefix_share.choose_layout(flash, [49], demo) == "cache"  # no custom 4-D mask there


def test_bad_mask_is_refused(model):
    responses = _responses()
    mb = collate(PROMPTS, responses)
    short = mb.mask.clone()
    short[0, short[0].nonzero()[0]] = False  # sample 0 loses one response position
    with pytest.raises(ValueError, match="mask"):
        prefix_share.shared_prefix_logprobs(model, PROMPTS, responses, short, 1.0)
    with pytest.raises(ValueError, match="at least one token"):
        prefix_share.shared_prefix_logprobs(model, [[1], []], [[2], [3]], mb.mask[:2], 1.0)
    with pytest.raises(ValueError, match="layout"):
        prefix_share.shared_prefix_logprobs(model, PROMPTS, responses, mb.mask, 1.0, layout="tree")


# ---- whole train steps ------------------------------------------------------------------------
def _assert_same_update(a: Trainer, b: Trainer, ma: dict, mb: dict) -> None:
    assert ma["actor/loss"] == pytest.approx(mb["actor/loss"], rel=1e-5, abs=1e-6)
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-4)
    # the gradients (still held after the optimizer step) agree to float rounding; AdamW's early steps
    # are ~lr * sign(gradient), so an entry whose gradient is ~1e-9 (rounding-sized) may move by up to
    # 2 lr either way: all but a handful of weights agree to 1e-5, none by more than two AdamW steps
    moved, off_weights, total = 0, 0, 0
    for (n, pa), pb, p0 in zip(a.model.named_parameters(), b.model.parameters(), a._initial):
        if pa.grad is None:
            assert pb.grad is None, n
            continue
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6, rtol=1e-4), n
        assert (pa - pb).abs().max() <= 2 * 2 * a.cfg.lr, n
        off_weights, total = off_weights + int(((pa - pb).abs() > 1e-5).sum()), total + pa.numel()
        moved += int(not torch.equal(pa, p0))
    assert moved > 0 and off_weights <= 1e-3 * total


def _pair(tiny, algo=None, **over):
    on, off = _trainer(tiny, True, algo, **over), _trainer(tiny, False, algo, **over)
    on._initial = [p.detach().clone() for p in on.model.parameters()]
    return on, off


# mini_batches 2: old logprobs through `_old_logprobs`; a small lr keeps the first mini-batch's AdamW step
# (which can flip rounding-sized gradient entries, see above) from separating the second one's weights
@pytest.mark.parametrize("over, layout", [({}, "auto"), ({}, "cache"), ({"micro_batch_size": 12}, "auto"),
                                          ({"mini_batches": 2, "micro_batch_size": 3, "lr": 1e-6}, "auto")])
def test_train_step_on_and_off_give_the_same_weights(tiny, shared_calls, over, layout):
    algo = OmegaConf.structured(AlgoConfig)
    algo.kl_coef = 0.1  # ref logprobs enter the loss too
    on, off = _pair(tiny, algo, **over)
    on.shared_prefix_layout = layout  # "auto" picks "row" for these short rows
    batch = _batch()
    # reference logprobs near the policy's (k3 KL stays moderate): the plain path's, shifted by 0.1
    batch.ref_logprobs = [[v + 0.1 for v in r] for r in off.logprobs(batch.prompt_ids, batch.response_ids)]
    ma, mb = on.train_step(batch), off.train_step(batch)
    assert shared_calls and on.shared_prefix_on and not off.shared_prefix_on
    assert ma["actor/kl"] > 0
    _assert_same_update(on, off, ma, mb)


def test_multi_turn_response_mask(tiny, shared_calls):
    on, off = _pair(tiny)
    ma, mb = on.train_step(_batch(response_mask=True)), off.train_step(_batch(response_mask=True))
    assert shared_calls
    _assert_same_update(on, off, ma, mb)


def test_lora(tiny, shared_calls):
    on, off = _pair(tiny, lora={"rank": 4})
    ma, mb = on.train_step(_batch()), off.train_step(_batch())
    assert shared_calls and on.peft is not None
    _assert_same_update(on, off, ma, mb)


def test_trainer_and_reference_logprobs(tiny, shared_calls):
    batch = _batch()
    on, off = _trainer(tiny, True), _trainer(tiny, False)
    lp_on, lp_off = on.logprobs(batch.prompt_ids, batch.response_ids), off.logprobs(
        batch.prompt_ids, batch.response_ids)
    ref_on = Reference(str(tiny), 0.7, micro_batch_size=5, num_threads=1)
    ref_off = Reference(str(tiny), 0.7, micro_batch_size=5, num_threads=1, shared_prefix=False)
    assert ref_on.shared_prefix and not ref_off.shared_prefix
    r_on = ref_on.logprobs(batch.prompt_ids, batch.response_ids)
    n = len(shared_calls)
    assert n > 0
    r_off = ref_off.logprobs(batch.prompt_ids, batch.response_ids)
    assert len(shared_calls) == n
    for got, want, rg, rw, r in zip(lp_on, lp_off, r_on, r_off, batch.response_ids):
        assert len(got) == len(rg) == len(r)  # in the input order, one value per response token
        assert got == pytest.approx(want, abs=1e-5) and rg == pytest.approx(rw, abs=1e-5)
        assert rg == pytest.approx(got, abs=1e-5)  # same weights, same temperature


# ---- fallbacks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("over, reason", [({"packing": True, "micro_batch_tokens": 32}, "packing"),
                                          ({"gradient_checkpointing": True}, "gradient_checkpointing")])
def test_fallback_trains_like_the_plain_path(tiny, shared_calls, over, reason, caplog):
    on, off = _trainer(tiny, True, **over), _trainer(tiny, False, **over)
    on._initial = [p.detach().clone() for p in on.model.parameters()]
    assert reason in prefix_share.trainer_fallback_reason(on)
    with caplog.at_level("WARNING", logger="actors.model.prefix_share"):
        ma, mb = on.train_step(_batch()), off.train_step(_batch())
        _assert_same_update(on, off, ma, mb)
        on.train_step(_batch(seed=1))
    assert not shared_calls and not on.shared_prefix_on
    assert sum("trainer.shared_prefix" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_fallback_reasons_for_moe_fsdp_and_models(tiny, model, tmp_path):
    cfg = OmegaConf.structured(TrainerConfig)
    fake = SimpleNamespace(cfg=cfg, model=model, router_aux=None, dp_size=1)
    assert prefix_share.trainer_fallback_reason(fake) is None
    assert "router" in prefix_share.trainer_fallback_reason(SimpleNamespace(**{**vars(fake), "router_aux": object()}))
    assert "FSDP2" in prefix_share.trainer_fallback_reason(SimpleNamespace(**{**vars(fake), "dp_size": 2}))
    cfg_off = OmegaConf.merge(cfg, {"shared_prefix": False})
    assert "false" in prefix_share.trainer_fallback_reason(SimpleNamespace(**{**vars(fake), "cfg": cfg_off}))
    mistral = MistralForCausalLM(MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                               sliding_window=16))
    assert "sliding" in prefix_share.model_fallback_reason(mistral)
    assert "not one of" in prefix_share.model_fallback_reason(model.get_decoder())
    ref = Reference(str(tiny), 1.0, micro_batch_size=3, num_threads=1, micro_batch_tokens=32)
    assert not ref.shared_prefix  # packed reference rows keep the plain path
