"""The configuration matrix (issue 37; tests/unit/config_matrix.py): every config key with a choice in pairwise
combinations. Each pair of levels is either refused at load with an error naming both keys (the table in
docs/configuration.md lists each), or is in a combination that loads and trains one step of the real Trainer (tiny random Llama, in-process) on an on-policy batch with a finite
loss, on-policy ratios within fp32 noise of 1 on the first mini-batch (the engine's logprobs are the policy's own
under the run's sampling distribution, truncations included) and no token masked by a mismatch correction. (Every
sample counted once through lost workers, reissues and resumes: the integration tier's fault and resume tests.)

Orchestration-only switches (placement mode, streaming, multi-turn, dynamic sampling, context parallelism, elastic
rollout) are
checked at load here; their one-step runs on Ray live in the integration tier (docs/configuration.md, the matrix).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer.trainer import Trainer
from orchestrator.algo import AdvantageInputs, SamplerSettings, compute_token_advantages
from orchestrator.algo.batch import TrainBatch
from orchestrator.config import ConfigError, load_config
from tests.unit.config_matrix import factors, keys_of, overrides, pairwise_cases
from tests.unit.trainer_helpers import random_batch, save_tiny_llama



def _load_error(over: list[str]):
    """None when the config loads, else its ConfigError's message."""
    try:
        load_config("configs/grpo_arith_cpu.yaml", over)
    except ConfigError as e:
        return str(e)
    return None


CASES, REFUSED = pairwise_cases(_load_error)  # every case loads; REFUSED: the pairs refused at load, with the error
IDS = [f"case{i}" for i in range(len(CASES))]
DOCS = Path("docs/configuration.md").read_text()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


def test_the_matrix_covers_every_pair_and_grows_with_the_registries():
    table = factors()
    assert set(table["algo.policy_loss"]) >= {"ppo_clip", "gspo", "gspo_token", "cispo"}
    assert "gae" in table["algo.estimator"] and "disaggregated_async" in table["placement.mode"]
    assert set(table["rollout.mode"]) == {"sync", "one_step_off", "stream"}
    names = list(table)
    order = {n: i for i, n in enumerate(names)}
    pairs = {(a, c[a], b, c[b]) for c in CASES for a in c for b in c if order[a] < order[b]}
    want = {(a, la, b, lb) for a in names for b in names if order[a] < order[b] for la in table[a] for lb in table[b]}
    assert pairs | set(REFUSED) == want and not pairs & set(REFUSED)  # all-pairs: each run or refused at load
    assert len(CASES) < 60  # sized for the unit tier


def test_every_refused_pair_names_both_keys_and_is_in_the_docs_table():
    assert REFUSED, "no pair refused: the table in docs/configuration.md would be stale"
    for (a, la, b, lb), error in REFUSED.items():
        # a pair refused by itself names both keys; one a third key forbids (none today) names one of them and that key
        assert any(k in error for k in keys_of(a)) or any(k in error for k in keys_of(b)), error
        assert f"| `{a}` = `{la}` | `{b}` = `{lb}` |" in DOCS, f"docs/configuration.md lacks the refused pair {a}={la}, {b}={lb}"


def _step_batch(trainer: Trainer, cfg) -> TrainBatch:
    """8 samples in 2 groups, advantages by the case's estimator (zero critic values for GAE), rollout logprobs the
    policy's own under the run's sampling distribution (on-policy)."""
    batch = random_batch(8, seed=1)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25])
    width = max(len(r) for r in batch.response_ids)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch.response_ids])
    inputs = AdvantageInputs(rewards, torch.tensor([0] * 4 + [1] * 4), mask,
                             values=torch.zeros(mask.shape) if cfg.algo.estimator == "gae" else None)
    adv = compute_token_advantages(cfg.algo.estimator, inputs, cfg.algo)
    batch.advantages = [adv[i, : len(r)].tolist() for i, r in enumerate(batch.response_ids)]
    batch.rollout_logprobs = trainer.logprobs(batch.prompt_ids, batch.response_ids)
    return batch


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_each_combination_trains_one_exact_step(case, tiny):
    cfg = load_config("configs/grpo_arith_cpu.yaml", overrides(case))
    tc = OmegaConf.to_container(cfg.trainer)
    tc.update({"num_threads": 1, "micro_batch_size": 3, "context_parallel_size": 1, "num_workers": 1,
               "precision": "fp32", "warmup_steps": 0})  # context parallelism: Ray ranks (integration tier)
    trainer = Trainer(str(tiny), OmegaConf.create(tc), cfg.algo, SamplerSettings.from_rollout(cfg.rollout),
                      max_new_tokens=8)
    batch = _step_batch(trainer, cfg)
    m = trainer.train_step(batch)
    assert math.isfinite(m["actor/loss"]) and m["actor/skipped_updates"] == 0, (case, m)
    assert m["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5), case  # one mini-batch: on-policy
    assert m["rollout/mismatch_ratio_min"] == pytest.approx(1.0, abs=1e-4), case  # engine == policy, truncation too
    assert m["rollout/mismatch_ratio_max"] == pytest.approx(1.0, abs=1e-4), case
    assert m["actor/logprob_gap_abs"] < 1e-5 and m["rollout/mismatch_masked_token_frac"] == 0.0, case
