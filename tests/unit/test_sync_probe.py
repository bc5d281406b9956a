"""The weight-sync logprob probe's pure parts (orchestrator/weight_sync/probe.py): comparison, tolerance,
schedule, the probe's tokens, and that a failed probe is retried like a checksum mismatch."""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator.config import ConfigError, load_config
from orchestrator.weight_sync import WeightMismatchError
from orchestrator.guards import DivergedError
from orchestrator.weight_sync.probe import (DEFAULT_KL_TOLERANCE, DEFAULT_TOLERANCE, LOGPROB_SCALE,
                                            PolicyDivergedError, ProbeMismatchError, ProbeScores, check_probe,
                                            compare_probe, divergence_note, kl_tolerance_for, probe_due, probe_full_kl,
                                            probe_nll, probe_tokens, tolerance_for)
from orchestrator.weight_sync.syncer import WeightSyncer

CFG = load_config("configs/grpo_arith_cpu.yaml")


def test_within_tolerance_returns_the_largest_difference():
    assert compare_probe([-1.0, -2.5, -0.25], [-1.0004, -2.5, -0.2499], 1e-3, "rollout worker 0") == pytest.approx(4e-4)
    assert compare_probe([], [], 1e-3, "rollout worker 0") == 0.0


def test_outside_tolerance_names_engine_difference_token_and_tolerance():
    with pytest.raises(ProbeMismatchError, match=r"rollout worker 1: .* up to 0\.5 nats \(token 2: engine -3, "
                                                 r"trainer -2.5\), above weight_sync.probe_tolerance=0.001"):
        compare_probe([-1.0, -2.0, -3.0], [-1.0, -2.0001, -2.5], 1e-3, "rollout worker 1")
    assert issubclass(ProbeMismatchError, WeightMismatchError)  # retried like a checksum mismatch


def test_the_tolerance_grows_with_the_logprob_magnitude_beyond_the_scale():
    # the diverged run of issue 37: identical weights, a token at -176.5 nats, 0.0176 apart: arithmetic, not a fault
    assert compare_probe([-176.49], [-176.472], 1e-3, "rollout worker 0") == pytest.approx(0.018, abs=1e-3)
    # the negative control's corrupted layer (docs/weight-sync.md): 0.0544 at -11.2 nats is still caught ...
    with pytest.raises(ProbeMismatchError, match=r"\(x 2\.81 at that logprob\)"):
        compare_probe([-11.2755], [-11.2211], 1e-3, "rollout worker 1")
    # ... and within LOGPROB_SCALE nats the tolerance is the configured one
    assert LOGPROB_SCALE == 4.0
    with pytest.raises(ProbeMismatchError, match=r"probe_tolerance=0.001: the engine"):
        compare_probe([-3.0], [-3.0011], 1e-3, "rollout worker 1")


def test_a_diverged_policy_is_named_by_its_own_probe_nll_and_a_healthy_one_is_not():
    start = probe_nll([-2.0, -1.0, -3.0])
    assert start == pytest.approx(2.0)
    assert divergence_note([-2.5, -1.5, -4.0], start, 5.0, 3) is None  # +0.67 nats: training, not divergence
    note = divergence_note([-176.5, -150.0, -200.0], start, 5.0, 2)
    assert note.startswith("the policy diverged by weight version 2: the trainer's own logprobs of the fixed probe text "
                           "average -175.5 nats per token (the starting weights: -2") and "trainer.lr" in note
    assert divergence_note([math.nan, -1.0], start, 5.0, 4).startswith("the policy diverged by weight version 4")
    assert divergence_note([-176.5], start, 0.0, 2) is None  # guards.probe_nll_rise=0: off
    assert issubclass(PolicyDivergedError, DivergedError) and not issubclass(PolicyDivergedError, WeightMismatchError)


def test_nan_is_reported_as_not_finite_not_as_a_difference():
    with pytest.raises(ProbeMismatchError, match=r"rollout worker 0: probe logprob at token 1 is not finite "
                                                 r"\(engine nan, trainer -2.0\)"):
        compare_probe([-1.0, math.nan], [-1.0, -2.0], 1.0, "rollout worker 0")


def test_lengths_must_agree():
    with pytest.raises(ValueError, match="2 engine logprobs for 3 trainer logprobs"):
        compare_probe([-1.0, -2.0], [-1.0, -2.0, -3.0], 1e-3, "rollout worker 0")


def test_tolerance_by_dtype_unless_configured():
    assert tolerance_for(0.0, "float32") == DEFAULT_TOLERANCE["float32"]
    assert tolerance_for(0.0, "bfloat16") == DEFAULT_TOLERANCE["bfloat16"] > DEFAULT_TOLERANCE["float32"]
    assert tolerance_for(0.02, "float32") == 0.02
    with pytest.raises(ValueError, match="rollout.dtype='int8'"):
        tolerance_for(0.0, "int8")


def test_probe_every_n_syncs_starting_with_the_first():
    assert [probe_due(k, 1) for k in range(4)] == [True] * 4
    assert [probe_due(k, 3) for k in range(7)] == [True, False, False, True, False, False, True]


def test_config_keys_and_their_ranges():
    ws = CFG.weight_sync
    assert (ws.probe, ws.probe_every, ws.probe_tolerance) == (True, 1, 0.0)
    with pytest.raises(ConfigError, match="weight_sync.probe_every=0"):
        load_config("configs/grpo_arith_cpu.yaml", ["weight_sync.probe_every=0"])
    with pytest.raises(ConfigError, match="weight_sync.probe_tolerance=-1"):
        load_config("configs/grpo_arith_cpu.yaml", ["weight_sync.probe_tolerance=-1"])


def test_probe_tokens_of_the_default_tokenizer():
    from transformers import AutoTokenizer

    from orchestrator.utils.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    prompt, cont = probe_tokens(lambda s: tok.encode(s, add_special_tokens=False))
    assert 16 <= len(prompt) <= 40 and 16 <= len(cont) <= 32
    assert tok.decode(cont) == " He has 12 + 30 = 42 apples, so the answer is 42."
    with pytest.raises(ValueError, match="1 prompt and 1 continuation ids"):
        probe_tokens(lambda s: [7])


class _ProbeFails(WeightSyncer):
    """A syncer whose first sync fails its probe."""

    def __init__(self):
        super().__init__(CFG, trainer=None, engines=[])
        self.calls = 0

    def sync(self, version, engine_ids=None):
        self.calls += 1
        if self.calls == 1:
            raise ProbeMismatchError("rollout worker 0: probe logprobs differ from the trainer's by up to 0.7 nats")
        return {"sync/version": version, "sync/probe_max_abs_diff": 1e-5}


def test_a_failed_probe_is_redone_and_counted_then_raised_when_retries_are_spent():
    s = _ProbeFails()
    assert s.sync_with_retries(4, retries=1)["sync/failures"] == 1 and s.calls == 2
    with pytest.raises(ProbeMismatchError, match="rollout worker 0"):
        _ProbeFails().sync_with_retries(4, retries=0)


def _engine_top(rows: torch.Tensor, k: int, actual: list[int]) -> list[dict[int, float]]:
    """What vLLM's prompt logprobs give: per position the top-k ids' logprobs and the actual token's."""
    out = []
    for t, row in enumerate(rows):
        ids = torch.topk(row, k).indices.tolist() + [actual[t]]
        out.append({i: float(row[i]) for i in ids})
    return out


def test_full_kl_is_zero_for_equal_distributions_and_equals_the_full_kl_when_k_covers_the_vocabulary():
    g = torch.Generator().manual_seed(0)
    trainer = torch.log_softmax(torch.randn(5, 12, generator=g) * 2, -1)
    engine = torch.log_softmax(torch.randn(5, 12, generator=g) * 2, -1)
    actual = [3, 1, 4, 1, 5]
    assert probe_full_kl(_engine_top(trainer, 4, actual), trainer) == pytest.approx(0.0, abs=1e-12)
    e64, t64 = engine.double(), trainer.double()
    full = (e64.exp() * (e64 - t64)).sum(-1).max().item()  # KL(engine || trainer), the largest position
    assert probe_full_kl(_engine_top(engine, 12, actual), trainer) == pytest.approx(full, rel=1e-6)
    coarse = probe_full_kl(_engine_top(engine, 3, actual), trainer)
    assert 0 < coarse <= full + 1e-12  # coarse-graining: a lower bound (data-processing inequality)


def test_full_kl_sees_a_wrong_logit_outside_the_sampled_tokens_that_the_logprob_probe_misses():
    """Two non-sampled tokens' logits swapped in the engine: the sampled tokens' logprobs are bit-equal (the
    normaliser is unchanged), the distributions are not (hand-computed: the trainer's p = [0.5, 0.3, 0.15, 0.05], the
    engine's with tokens 1 and 3 swapped; over the engine's top 2 {0, 3} and the rest: 0.5 ln(0.5/0.5) +
    0.3 ln(0.3/0.05) + 0.2 ln(0.2/0.45) = 0.3753)."""
    trainer = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    engine = trainer[:, [0, 3, 2, 1]]
    want = 0.3 * math.log(0.3 / 0.05) + 0.2 * math.log(0.2 / 0.45)
    top = [{0: float(engine[0, 0]), 3: float(engine[0, 3])}]  # top-2 of the engine: tokens 0 and 3
    assert probe_full_kl(top, trainer) == pytest.approx(want, rel=1e-6)
    sampled = ProbeScores([float(engine[0, 0])], top=top)
    with pytest.raises(ProbeMismatchError, match=r"rollout worker 1: the engine's next-token distributions on the "
                                                 r"probe text differ from the trainer's by a KL of 0\.375 nats .*"
                                                 r"weight_sync.probe_kl_tolerance=0\.0001, while the sampled tokens' "
                                                 r"logprobs agree within 0 nats"):
        check_probe(sampled, ProbeScores([float(trainer[0, 0])], rows=trainer), 1e-3, 1e-4, "rollout worker 1")
    assert check_probe(ProbeScores([-0.7], top=None), ProbeScores([-0.7], rows=trainer), 1e-3, 1e-4, "w") == (0.0, None)


def test_full_kl_of_non_finite_logits_is_inf_and_positions_must_agree():
    rows = torch.log_softmax(torch.zeros(2, 4), -1)
    assert probe_full_kl([{0: float("nan")}, {1: -1.0}], rows) == math.inf
    with pytest.raises(ValueError, match="1 engine positions for 2 trainer rows"):
        probe_full_kl([{0: -1.0}], rows)


def test_kl_tolerance_by_dtype_unless_configured():
    assert kl_tolerance_for(0.0, "float32") == DEFAULT_KL_TOLERANCE["float32"]
    assert kl_tolerance_for(0.3, "bfloat16") == 0.3
    with pytest.raises(ValueError, match="weight_sync.probe_kl_tolerance=0 .* rollout.dtype='float64'"):
        kl_tolerance_for(0.0, "float64")
