"""Rollout/trainer mismatch correction (orchestrator/algo/mismatch.py) and its metrics
(orchestrator/algo/mismatch_metrics.py): hand-computed weights, masks and metrics for every mode, the
unchanged default loss, micro-batch / data-parallel invariance, and the config checks.

One hand-made batch, B = 2, T = 3, old logprobs 0 and rollout logprobs -log rho:
row 0: rho = [1.5, 3, 0.25] (prod 1.125, geometric mean 1.125^(1/3) = 1.0400); row 1: rho = [0.8, 1.25, -]
(the last token is padding; prod 1.0, geometric mean 1.0).
"""
from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from orchestrator.algo import LossConfig, LossInputs, compute_policy_loss, importance_weight, loss_normalizer, masked
from orchestrator.algo.loss import masked_terms
from orchestrator.algo.loss_parts import add_kl, aggregate, clipped_surrogate, kl_term, loss_metrics
from orchestrator.algo.mismatch import MISMATCH_MODES, MismatchSettings, correction, uses_rollout_logprobs
from orchestrator.algo.mismatch_metrics import MismatchStats
from orchestrator.config import ConfigError, load_config

RHO = torch.tensor([[1.5, 3.0, 0.25], [0.8, 1.25, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, True], [True, True, False]])
OLD = torch.zeros(2, 3, dtype=torch.float64)
ROLLOUT = -torch.log(RHO)


def _cfg(mode: str = "none", tis_cap=2.0, **kw) -> LossConfig:
    return LossConfig(tis_cap=tis_cap, rollout_correction=MismatchSettings(mode=mode, **kw))


def _weights(cfg) -> tuple[list, list]:
    c = correction(OLD, ROLLOUT, MASK, cfg)
    w = c.weight if c.weight is not None else torch.ones_like(OLD)
    return [[round(float(w[b, t]), 6) for t in range(3) if MASK[b, t]] for b in range(2)], c.kept[MASK].tolist()


@pytest.mark.parametrize("mode, kw, tis_cap, weights, kept", [
    # TIS alone: min(rho, 2)
    ("none", {}, 2.0, [[1.5, 2.0, 0.25], [0.8, 1.25]], [True] * 5),
    ("none", {}, None, [[1.0, 1.0, 1.0], [1.0, 1.0]], [True] * 5),
    # IcePop [0.5, 2]: rho 3 and 0.25 leave; the rest keep min(rho, tis_cap), or 1 without TIS
    ("token_mask", {}, 2.0, [[1.5, 0.0, 0.0], [0.8, 1.25]], [True, False, False, True, True]),
    ("token_mask", {}, None, [[1.0, 0.0, 0.0], [1.0, 1.0]], [True, False, False, True, True]),
    ("token_mask", {"token_low": 0.2, "token_high": 4.0}, None, [[1.0] * 3, [1.0] * 2], [True] * 5),
    # Seq-TIS: min(prod rho, cap) on every token; tis_cap is not used
    ("seq_truncate", {}, 2.0, [[1.125] * 3, [1.0] * 2], [True] * 5),
    ("seq_truncate", {"seq_cap": 1.1}, None, [[1.1] * 3, [1.0] * 2], [True] * 5),
    # Seq-MIS: the full product, or 0 for a sequence above the cap
    ("seq_mask", {}, 2.0, [[1.125] * 3, [1.0] * 2], [True] * 5),
    ("seq_mask", {"seq_cap": 1.1}, 2.0, [[0.0] * 3, [1.0] * 2], [False] * 3 + [True] * 2),
    # Geo-RS: row 0's geometric mean 1.04 leaves [0.999, 1.001]; row 1 (1.0) keeps its TIS weights
    ("geo_mask", {}, 2.0, [[0.0] * 3, [0.8, 1.25]], [False] * 3 + [True] * 2),
    ("geo_mask", {"geo_low": 0.9, "geo_high": 1.05}, None, [[1.0] * 3, [1.0] * 2], [True] * 5),
    ("geo_mask", {"geo_low": 0.9, "geo_high": 1.03}, None, [[0.0] * 3, [1.0] * 2], [False] * 3 + [True] * 2),
])
def test_weights_and_kept_tokens_by_hand(mode, kw, tis_cap, weights, kept):
    got_w, got_kept = _weights(_cfg(mode, tis_cap, **kw))
    assert got_w == weights and got_kept == kept


def test_no_rollout_logprobs_no_weight_and_mode_none_is_todays_tis_bit_for_bit():
    c = correction(OLD, None, MASK, _cfg("seq_mask"))
    assert c.weight is None and torch.equal(c.kept, MASK)
    assert correction(OLD, ROLLOUT, MASK, _cfg("none", None)).weight is None
    old, rollout = torch.randn(4, 5), torch.randn(4, 5)
    mask = torch.rand(4, 5) > 0.3
    expected = importance_weight(masked(old, mask), masked(rollout, mask), 2.0)
    assert torch.equal(correction(masked(old, mask), rollout, mask, LossConfig(tis_cap=2.0)).weight, expected)


def test_sequence_products_do_not_overflow_on_long_sequences():
    old, rollout, mask = torch.zeros(1, 200), torch.full((1, 200), -1.0), torch.ones(1, 200, dtype=torch.bool)
    assert torch.equal(correction(old, rollout, mask, _cfg("seq_truncate")).weight, torch.full((1, 200), 2.0))
    c = correction(old, rollout, mask, _cfg("seq_mask"))  # prod = e^200: masked, no inf * 0
    assert torch.equal(c.weight, torch.zeros(1, 200)) and not c.kept.any()


def _old_finish_loss(pg, clipped, t, inputs, cfg):
    """finish_loss as it was before orchestrator/algo/mismatch.py (TIS inline)."""
    weight = None
    if cfg.tis_cap is not None and inputs.rollout_logprobs is not None:
        weight = importance_weight(t.old_logprobs, masked(inputs.rollout_logprobs, t.mask), cfg.tis_cap)
        pg = pg * weight
    ref = masked(inputs.ref_logprobs, t.mask) if inputs.ref_logprobs is not None else None
    kl = kl_term(t.logprobs, ref, cfg.kl_estimator)
    loss = aggregate(add_kl(pg, kl, cfg.kl_coef).float(), t.mask, cfg.loss_agg, inputs.normalizer,
                     inputs.max_response_len)
    return loss, loss_metrics(t.mask, pg, t.ratio, kl=kl, clipped=clipped, weight=weight)


def test_default_loss_and_gradient_are_bit_identical_to_before():
    gen = torch.Generator().manual_seed(3)
    lp = (torch.randn(4, 6, generator=gen) - 2).requires_grad_()
    mask = torch.rand(4, 6, generator=gen) > 0.2
    inputs = LossInputs(lp, lp.detach() + 0.1 * torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen),
                        mask, float(mask.sum()), rollout_logprobs=lp.detach() + 0.5 * torch.randn(4, 6, generator=gen))
    cfg = LossConfig(tis_cap=2.0)
    loss, metrics = compute_policy_loss(inputs, cfg)
    grad = torch.autograd.grad(loss, lp)[0]
    t = masked_terms(inputs)
    pg, clipped = clipped_surrogate(t.ratio, t.advantages, cfg.clip_low, cfg.clip_high)
    old_loss, old_metrics = _old_finish_loss(pg, clipped, t, inputs, cfg)
    assert torch.equal(loss, old_loss)
    assert {k: metrics[k] for k in old_metrics} == old_metrics  # the losses' new step metrics come on top
    assert torch.equal(grad, torch.autograd.grad(old_loss, lp)[0])


def test_the_loss_applies_the_weight_to_the_policy_gradient_term():
    # ratio 1 (logprobs = old), A = 1: pg_t = -w_t; token-mean over 5 tokens
    lp = OLD.clone().float().requires_grad_()
    inputs = LossInputs(lp, OLD.float(), torch.ones(2, 3), MASK, 5.0, rollout_logprobs=ROLLOUT.float())
    loss, m = compute_policy_loss(inputs, _cfg("token_mask"))
    assert loss.item() == pytest.approx(-(1.5 + 0.8 + 1.25) / 5, abs=1e-6)
    assert m["actor/tis_weight_mean"] == pytest.approx((1.5 + 0.8 + 1.25) / 5, abs=1e-6)
    loss, _ = compute_policy_loss(inputs, _cfg("seq_mask", seq_cap=1.1))
    assert loss.item() == pytest.approx(-(0 + 0 + 0 + 1.0 + 1.0) / 5, abs=1e-6)


def _stats_by_hand(cfg) -> dict[str, float]:
    stats = MismatchStats(cfg)
    stats.absorb(stats.micro_batch(OLD, OLD, ROLLOUT, MASK))
    return stats.finish(lambda v: v)


def test_metrics_by_hand():
    log_rho = [math.log(x) for x in (1.5, 3.0, 0.25, 0.8, 1.25)]
    m = _stats_by_hand(_cfg("token_mask"))
    assert m["rollout/mismatch_kl_k1"] == pytest.approx(-math.log(1.125) / 5)
    assert m["rollout/mismatch_kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in log_rho) / 5)
    assert m["rollout/mismatch_kl_k3"] == pytest.approx((6.8 - 5 - math.log(1.125)) / 5)
    assert m["rollout/mismatch_ratio_max"] == pytest.approx(3.0) and m["rollout/mismatch_ratio_min"] == pytest.approx(0.25)
    assert m["rollout/mismatch_masked_token_frac"] == pytest.approx(2 / 5)
    assert m["rollout/mismatch_masked_seq_frac"] == 0.0
    for mode, tokens, seqs in (("none", 0, 0), ("seq_truncate", 0, 0), ("geo_mask", 3 / 5, 1 / 2)):
        m = _stats_by_hand(_cfg(mode))
        assert (m["rollout/mismatch_masked_token_frac"], m["rollout/mismatch_masked_seq_frac"]) == (tokens, seqs)
    m = _stats_by_hand(_cfg("seq_mask", seq_cap=1.1))
    assert (m["rollout/mismatch_masked_token_frac"], m["rollout/mismatch_masked_seq_frac"]) == (3 / 5, 1 / 2)


def test_metrics_with_old_logprobs_rollout_compare_the_current_logprobs():
    # old = rollout (nothing to correct); the metrics then measure the current logprobs against the engine's
    stats = MismatchStats(SimpleNamespace(old_logprobs="rollout", tis_cap=None, rollout_correction=None))
    sums = stats.micro_batch(ROLLOUT, OLD, ROLLOUT, MASK)
    assert sums["actor/rollout_kl_k1"] == pytest.approx(-math.log(1.125))
    assert sums["actor/logprob_gap_abs"] == pytest.approx(sum(abs(math.log(x)) for x in (1.5, 3, 0.25, 0.8, 1.25)))
    stats.absorb(sums)
    assert stats.finish(lambda v: v)["rollout/mismatch_kl_k1"] == pytest.approx(-math.log(1.125) / 5)


@pytest.mark.parametrize("mode", MISMATCH_MODES)
def test_metrics_are_exact_over_micro_batches_and_ranks(mode):
    gen = torch.Generator().manual_seed(5)
    old = torch.randn(8, 5, generator=gen, dtype=torch.float64) - 2
    rollout = old + 0.4 * torch.randn(8, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(8, 5, generator=gen) > 0.3
    mask[3] = False  # an empty row
    cfg = _cfg(mode, geo_low=0.9, geo_high=1.1)
    whole = MismatchStats(cfg)
    whole.absorb(whole.micro_batch(old, old, rollout, mask))
    expected = whole.finish(lambda v: v)
    ranks = [MismatchStats(cfg), MismatchStats(cfg)]  # 2 ranks, 2 mini-batches, uneven micro-batches
    for rows in (range(0, 4), range(4, 8)):
        reduced: dict[str, float] = {}
        for rank, part in zip(ranks, (list(rows)[:1], list(rows)[1:])):
            for micro in (part[:1], part[1:]):
                for k, v in rank.micro_batch(old[micro], old[micro], rollout[micro], mask[micro]).items():
                    reduced[k] = reduced.get(k, 0.0) + v
        for rank in ranks:
            rank.absorb(dict(reduced))
    both = [r.peaks for r in ranks]
    all_max = lambda v: [max(p[i] for p in both) for i in range(len(v))]  # noqa: E731
    for rank in ranks:
        got = rank.finish(all_max)
        assert got.keys() == expected.keys()
        for k in expected:
            assert got[k] == pytest.approx(expected[k], rel=1e-12, abs=1e-15), k


def test_uses_rollout_logprobs():
    def algo(mode, tis_cap, old_logprobs="trainer"):
        return SimpleNamespace(old_logprobs=old_logprobs, tis_cap=tis_cap, rollout_correction=MismatchSettings(mode))

    assert uses_rollout_logprobs(algo("none", 2.0))  # today's default
    assert not uses_rollout_logprobs(algo("none", None))
    assert uses_rollout_logprobs(algo("geo_mask", None))
    assert not uses_rollout_logprobs(algo("geo_mask", 2.0, "rollout"))


def test_config_defaults_keys_and_errors_naming_the_key():
    cfg = load_config(None, [])
    rc = cfg.algo.rollout_correction
    assert (rc.mode, rc.token_low, rc.token_high, rc.seq_cap, rc.geo_low, rc.geo_high) == ("none", 0.5, 2.0, 2.0,
                                                                                           0.999, 1.001)
    assert load_config(None, ["algo.rollout_correction.mode=seq_mask"]).algo.rollout_correction.mode == "seq_mask"
    for override, message in (
        ("algo.rollout_correction.mode=icepop", "algo.rollout_correction.mode='icepop' is not allowed"),
        ("algo.rollout_correction.token_low=0", "algo.rollout_correction.token_low=0.0 must be in (0, 1]"),
        ("algo.rollout_correction.token_low=1.5", "algo.rollout_correction.token_low=1.5 must be in (0, 1]"),
        ("algo.rollout_correction.token_high=0.9", "algo.rollout_correction.token_high=0.9 must be"),
        ("algo.rollout_correction.seq_cap=inf", "algo.rollout_correction.seq_cap=inf must be a finite number"),
        ("algo.rollout_correction.geo_low=-1", "algo.rollout_correction.geo_low=-1.0 must be in (0, 1]"),
        ("algo.rollout_correction.geo_high=0.5", "algo.rollout_correction.geo_high=0.5 must be"),
    ):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")):
            load_config(None, [override])
    with pytest.raises(ConfigError, match="algo.rollout_correction.mode='token_mask' needs algo.old_logprobs=trainer"):
        load_config(None, ["algo.rollout_correction.mode=token_mask", "algo.old_logprobs=rollout"])


def test_async_staleness_accepts_a_sequence_level_is_mode_instead_of_tis():
    base = ["rollout.mode=one_step_off", "algo.tis_cap=null"]
    with pytest.raises(ConfigError, match="algo.tis_cap"):
        load_config(None, base)
    with pytest.raises(ConfigError, match="algo.tis_cap"):
        load_config(None, base + ["algo.rollout_correction.mode=token_mask"])  # a mask corrects no staleness
    assert load_config(None, base + ["algo.rollout_correction.mode=seq_truncate"]).algo.tis_cap is None


def test_direct_callers_get_the_same_range_errors():
    inputs = LossInputs(OLD.float(), OLD.float(), torch.ones(2, 3), MASK, 5.0, rollout_logprobs=ROLLOUT.float())
    with pytest.raises(ValueError, match="algo.rollout_correction.seq_cap=0.5 must be a finite number >= 1"):
        compute_policy_loss(inputs, _cfg("seq_truncate", seq_cap=0.5))
    with pytest.raises(ValueError, match="algo.rollout_correction.mode='x' is not allowed"):
        compute_policy_loss(inputs, _cfg("x"))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("mode", MISMATCH_MODES)
def test_loss_and_gradient_split_over_ranks_and_micro_batches_equal_the_unsplit(mode, agg):
    # the sequence weights depend on whole rows only, so any split of the rows gives the un-split update
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(8, 5, generator=gen, requires_grad=True)
    lp = torch.nn.functional.logsigmoid(logits)  # a differentiable stand-in for token logprobs
    old = lp.detach() + 0.1 * torch.randn(8, 5, generator=gen)
    rollout, adv = old + 0.3 * torch.randn(8, 5, generator=gen), torch.randn(8, 5, generator=gen)
    mask = torch.rand(8, 5, generator=gen) > 0.25
    mask[2] = False
    cfg = replace(_cfg(mode, geo_low=0.95, geo_high=1.05, token_low=0.8, token_high=1.25, seq_cap=1.2), loss_agg=agg)

    def loss_of(rows, normalizer):
        inputs = LossInputs(lp[rows], old[rows], adv[rows], mask[rows], normalizer, 5, rollout_logprobs=rollout[rows])
        return compute_policy_loss(inputs, cfg)[0]

    kept = correction(masked(old, mask), rollout, mask, cfg).kept
    if mode in ("token_mask", "seq_mask", "geo_mask"):  # the filter drops some tokens and keeps others
        assert (mask & ~kept).any() and kept.any()
    whole = loss_of(list(range(8)), loss_normalizer(mask, agg, max_response_len=5))
    want = torch.autograd.grad(whole, logits, retain_graph=True)[0]
    norm = loss_normalizer(mask, agg, max_response_len=5, dp_size=2)
    shards = [[[0], [1, 2, 3]], [[4, 5], [6], [7]]]  # 2 ranks, uneven micro-batches
    per_rank = [sum(loss_of(rows, norm) for rows in shard) for shard in shards]
    got = sum(per_rank) / 2  # the gradient average over ranks
    assert got.item() == pytest.approx(whole.item(), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(torch.autograd.grad(got, logits)[0], want, rtol=1e-5, atol=1e-7)
