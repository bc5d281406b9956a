"""The rollout/trainer mismatch correction on the plain Trainer (no Ray): the `rollout/mismatch_*` metrics of a
step with known rollout logprobs, and the update's invariance to the micro-batch size and the mini-batch split
of the metrics in every mode (orchestrator/algo/mismatch.py, orchestrator/algo/mismatch_metrics.py).
"""
from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from orchestrator.algo.mismatch import MISMATCH_MODES
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import save_tiny_llama, shifted_batch

METRICS = ("rollout/mismatch_kl_k1", "rollout/mismatch_kl_k3", "rollout/mismatch_ratio_max",
           "rollout/mismatch_ratio_min", "rollout/mismatch_masked_token_frac", "rollout/mismatch_masked_seq_frac")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_mismatch"))


def _trainer(tiny, mode: str = "none", tis_cap=2.0, **trainer) -> Trainer:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32", **trainer})
    algo = OmegaConf.structured(AlgoConfig)
    algo.tis_cap = tis_cap
    algo.rollout_correction.update({"mode": mode, "geo_low": 0.5, "geo_high": 1.5})
    return Trainer(str(tiny), tc, algo, temperature=1.0, max_new_tokens=8)


def _shift(i: int) -> float:
    return 0.25 if i % 2 == 0 else (1.0 if i % 4 == 1 else -1.0)  # rho: 1.284 | 2.718 | 0.368


def test_icepop_step_metrics_by_hand(tiny):
    trainer = _trainer(tiny, "token_mask")
    batch = shifted_batch(trainer, _shift)
    n = [len(r) for r in batch.response_ids]
    total = sum(n)
    m = trainer.train_step(batch)
    assert m["rollout/mismatch_kl_k1"] == pytest.approx(-sum(k * _shift(i) for i, k in enumerate(n)) / total, abs=1e-5)
    k3 = sum(k * (math.exp(_shift(i)) - 1 - _shift(i)) for i, k in enumerate(n)) / total
    assert m["rollout/mismatch_kl_k3"] == pytest.approx(k3, abs=1e-5)
    assert m["rollout/mismatch_ratio_max"] == pytest.approx(math.e, rel=1e-5)
    assert m["rollout/mismatch_ratio_min"] == pytest.approx(math.exp(-1), rel=1e-5)
    # rho = e and 1/e leave IcePop's [0.5, 2]: every odd sample's tokens; kept tokens weigh min(1.284, 2)
    odd = sum(k for i, k in enumerate(n) if i % 2)
    assert m["rollout/mismatch_masked_token_frac"] == pytest.approx(odd / total)
    assert m["rollout/mismatch_masked_seq_frac"] == pytest.approx(0.5)
    assert m["actor/tis_weight_mean"] == pytest.approx((total - odd) * math.exp(0.25) / total, rel=1e-5)


def test_metrics_are_reported_with_no_correction_and_no_tis(tiny):
    trainer = _trainer(tiny, "none", tis_cap=None)
    m = trainer.train_step(shifted_batch(trainer, lambda i: 0.5))
    assert m["rollout/mismatch_kl_k1"] == pytest.approx(-0.5, abs=1e-5)
    assert m["rollout/mismatch_ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-5)
    assert m["rollout/mismatch_masked_token_frac"] == 0.0 and "actor/tis_weight_mean" not in m


@pytest.mark.parametrize("mode", MISMATCH_MODES)
def test_update_and_metrics_are_invariant_to_micro_batch_size(tiny, mode):
    a, b = _trainer(tiny, mode, micro_batch_size=1), _trainer(tiny, mode, micro_batch_size=8)
    ma, mb = a.train_step(shifted_batch(a, _shift)), b.train_step(shifted_batch(b, _shift))
    assert ma["actor/loss"] == pytest.approx(mb["actor/loss"], abs=1e-6)
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-5)
    for key in METRICS:
        assert ma[key] == pytest.approx(mb[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("mode", ["token_mask", "seq_mask"])
def test_metrics_cover_the_whole_step_over_mini_batches(tiny, mode):
    # with two mini-batches the old logprobs are computed once before the first update, so the ratios and the
    # masks are those of one mini-batch; the metrics are the step's, not a mean of the mini-batches' values
    one, two = _trainer(tiny, mode), _trainer(tiny, mode, mini_batches=2)
    m1, m2 = one.train_step(shifted_batch(one, _shift)), two.train_step(shifted_batch(two, _shift))
    for key in METRICS:
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
