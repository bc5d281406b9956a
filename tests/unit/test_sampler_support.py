"""Training replays the sampler's distribution (issue 37 item 1; orchestrator/algo/sampler_support.py): the kept
set of top-k / top-p / min-p equals vLLM 0.32's own sampler functions on random logits, and the trainer's logprob
of a sampled token equals vLLM's processed logprob, so on-policy ratios are 1 to fp32 noise."""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator.algo import SamplerSettings, token_logprobs
from orchestrator.algo.entropy import token_entropy
from orchestrator.config import ConfigError, load_config

SETTINGS = [SamplerSettings(1.0, top_p=0.8), SamplerSettings(0.7, top_p=0.95), SamplerSettings(1.0, top_k=20),
            SamplerSettings(1.3, top_k=5, top_p=0.9), SamplerSettings(1.0, min_p=0.05),
            SamplerSettings(0.9, top_p=0.9, top_k=50, min_p=0.02)]


def _vllm_processed_logprobs(logits: torch.Tensor, s: SamplerSettings) -> torch.Tensor:
    """vLLM 0.32's processed logprobs (Sampler.sample order): temperature, min_p (MinPLogitsProcessor.apply), then
    apply_top_k_top_p_pytorch, then log_softmax."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    z = logits.float() / s.temperature
    if s.min_p > 0:  # MinPLogitsProcessor.apply, vllm/v1/sample/logits_processor/builtin.py
        probs = torch.softmax(z, dim=-1)
        z = z.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * s.min_p, -math.inf)
    n = z.shape[0]
    k = torch.full((n,), s.top_k, dtype=torch.long) if s.top_k > 0 else None
    p = torch.full((n,), s.top_p) if s.top_p < 1 else None
    return apply_top_k_top_p_pytorch(z.clone(), k, p).log_softmax(dim=-1)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}-m{s.min_p}")
def test_the_kept_set_and_the_sampled_logprob_equal_vllms(s):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g) * 3  # peaked enough for every truncation to act
    want = _vllm_processed_logprobs(logits, s)
    assert torch.equal(s.kept(logits / s.temperature), torch.isfinite(want))
    kept_counts = torch.isfinite(want).sum(dim=-1)
    assert kept_counts.min() >= 1 and kept_counts.max() < 1000  # it truncated
    tokens = torch.multinomial(want.exp(), 1, generator=g).squeeze(-1)  # sampled from the truncated distribution
    got = token_logprobs(logits[None], tokens[None], s)[0]
    ratio = (got - want.gather(-1, tokens[:, None]).squeeze(-1)).exp()
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)  # on-policy ratios are 1
    full = token_logprobs(logits[None], tokens[None], s.temperature)[0]  # before: the full softmax
    assert (full < got - 1e-4).all()  # the kept mass is < 1: the old ratio was biased low at every position


def test_the_issues_example_and_the_sampled_token_is_always_kept():
    z = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    s = SamplerSettings(top_p=0.8)
    assert s.kept(z).tolist() == [True, True, False, False]
    assert token_logprobs(z[None, None], torch.tensor([[0]]), s).exp().item() == pytest.approx(0.5 / 0.8)  # not 0.5
    assert token_logprobs(z[None, None], torch.tensor([[0]]), 1.0).exp().item() == pytest.approx(0.5)
    # a token the trainer's own logits would drop (a boundary flip) keeps a finite logprob: the sampler kept it
    assert token_logprobs(z[None, None], torch.tensor([[2]]), s).exp().item() == pytest.approx(0.15 / 0.95)


def test_entropy_is_the_truncated_distributions_and_gradients_stay_on_the_kept_set():
    z = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().requires_grad_()
    s = SamplerSettings(top_p=0.8)
    kept = torch.tensor([0.5, 0.3]) / 0.8
    assert token_entropy(z[None], s).item() == pytest.approx(float(-(kept * kept.log()).sum()), abs=1e-6)
    token_logprobs(z[None, None], torch.tensor([[0]]), s).sum().backward()
    assert z.grad[2:].abs().sum() == 0 and z.grad[:2].abs().sum() > 0


def test_settings_are_one_config_value_checked_at_load():
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["rollout.top_p=0.9", "rollout.top_k=20", "rollout.min_p=0.05"])
    s = SamplerSettings.from_rollout(cfg.rollout)
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.truncates) == (cfg.rollout.temperature, 0.9, 20, 0.05, True)
    assert s.vllm_kwargs() == {"temperature": cfg.rollout.temperature, "top_p": 0.9, "top_k": 20, "min_p": 0.05}
    assert not SamplerSettings.from_rollout(load_config("configs/grpo_arith_cpu.yaml").rollout).truncates
    with pytest.raises(ConfigError, match=r"rollout.min_p=1.0 must be in \[0, 1\)"):
        load_config("configs/grpo_arith_cpu.yaml", ["rollout.min_p=1.0"])
    with pytest.raises(ConfigError, match=r"rollout.top_k=-2"):
        load_config("configs/grpo_arith_cpu.yaml", ["rollout.top_k=-2"])
    with pytest.raises(ValueError, match="top_p: must be in"):
        SamplerSettings(top_p=0.0)
