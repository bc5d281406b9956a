"""The staleness correction of placement.mode=disaggregated_async, on the plain Trainer (no Ray).

A stale batch was sampled by older engine weights (the behaviour policy mu, its logprobs in
`rollout_logprobs`); with algo.old_logprobs=trainer the trainer's weights before the update are the
proximal policy, and the policy-gradient term is weighted by w = min(exp(logp_prox - logp_mu), tis_cap)
(decoupled PPO, Hilton et al. 2022; AReaL). With one mini-batch logp_prox is the current forward,
detached; with several, the logprobs computed once before the first update.
"""
from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import save_tiny_llama, shifted_batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_tis"))


def _trainer(tiny, mini_batches: int, tis_cap: float) -> Trainer:
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32",
               "mini_batches": mini_batches})
    algo = OmegaConf.structured(AlgoConfig)
    algo.update({"old_logprobs": "trainer", "tis_cap": tis_cap})
    return Trainer(str(tiny), tc, algo, temperature=1.0, max_new_tokens=8)


def _stale_batch(trainer: Trainer, shift) -> TrainBatch:
    """A batch whose behaviour logprobs are the trainer's current ones minus shift(i) (log space)."""
    return shifted_batch(trainer, shift)


def test_one_mini_batch_weights_by_current_detached_minus_rollout_logprobs(tiny):
    trainer = _trainer(tiny, mini_batches=1, tis_cap=2.0)
    shift = lambda i: 0.5 if i % 2 == 0 else 2.0  # exp(0.5) = 1.6487; exp(2.0) = 7.39 -> capped at 2
    batch = _stale_batch(trainer, shift)
    tokens = [len(r) for r in batch.response_ids]
    expected = sum(n * min(math.exp(shift(i)), 2.0) for i, n in enumerate(tokens)) / sum(tokens)
    m = trainer.train_step(batch)
    assert m["actor/tis_weight_mean"] == pytest.approx(expected, rel=1e-4)
    assert m["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # proximal = current weights


def test_later_mini_batches_keep_the_pre_update_weights_as_proximal_policy(tiny):
    # every token 0.5 nats below the pre-update policy: w = exp(0.5) in both mini-batches, although
    # the first optimizer step moved the weights before the second mini-batch
    trainer = _trainer(tiny, mini_batches=2, tis_cap=3.0)
    m = trainer.train_step(_stale_batch(trainer, lambda i: 0.5))
    assert m["actor/tis_weight_mean"] == pytest.approx(math.exp(0.5), rel=1e-4)
    assert m["actor/ratio_mean"] != pytest.approx(1.0, abs=1e-6)
