"""Each estimator and policy loss runs with its paper's settings unless the user sets them (issue 37 item 2;
orchestrator/config/paper_defaults.py, Registry.register(settings=, source=))."""
from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from orchestrator.algo import POLICY_LOSSES, LossInputs, compute_policy_loss, loss_normalizer
from orchestrator.algo.registry import Registry
from orchestrator.config import ConfigError, load_config
from orchestrator.config.paper_defaults import apply_paper_settings, say_once

CPU_YAML = "configs/grpo_arith_cpu.yaml"


def _gspo_two_sequences(algo) -> tuple[float, torch.Tensor]:
    """The issue's case: sequences of 1 and 3 tokens, advantages +1 and -1, on-policy. Returns the loss and each
    sequence's gradient with respect to its summed logprobs (d loss / d logprob summed over its tokens)."""
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
    normalizer = loss_normalizer(mask, algo.loss_agg)
    inputs = LossInputs(logprobs, logprobs.detach().clone(), advantages, mask, normalizer)
    loss, _ = compute_policy_loss(inputs, algo)
    loss.backward()
    return loss.item(), (logprobs.grad * mask).sum(dim=1)


@pytest.mark.parametrize("loss", ["gspo", "gspo_token"])
def test_gspo_runs_with_its_papers_sequence_mean_unless_set(loss, caplog):
    algo = load_config(CPU_YAML, [f"algo.policy_loss={loss}"]).algo
    assert (algo.loss_agg, algo.gspo_clip_low, algo.gspo_clip_high) == ("seq-mean-token-mean", 3e-4, 4e-4)
    value, grads = _gspo_two_sequences(algo)
    assert value == pytest.approx(0.0, abs=1e-7)  # eq. 5: 1/G sum_i -s_i A_i = -(1 - 1) / 2
    torch.testing.assert_close(grads, torch.tensor([-0.5, 0.5]))  # eq. 6: each sequence weighs 1/G
    cfg = load_config(CPU_YAML, [f"algo.policy_loss={loss}", "algo.loss_agg=token-mean"])
    assert cfg.algo.loss_agg == "token-mean"  # the user's setting wins ...
    value, grads = _gspo_two_sequences(cfg.algo)
    assert value == pytest.approx(0.5) and torch.allclose(grads, torch.tensor([-0.25, 0.75]))  # ... and is biased
    said: list = []  # what load_config logs (once per process: `say_once`), here collected
    algo = OmegaConf.merge(cfg.algo, {})
    assert apply_paper_settings(algo, {"algo.loss_agg"}, lambda level, msg: said.append((level, msg))) == {}
    assert len(said) == 1 and said[0][0] == logging.WARNING, said  # naming the paper's value and its source
    assert f"algo.policy_loss={loss}" in said[0][1] and "'seq-mean-token-mean'" in said[0][1] and "Zheng" in said[0][1]
    with caplog.at_level(logging.WARNING, logger="orchestrator.config.paper_defaults"):
        for _ in range(2):
            say_once(logging.WARNING, f"a message said once ({loss})")
    assert [r.getMessage() for r in caplog.records if "said once" in r.getMessage()] == [f"a message said once ({loss})"]


def test_ppo_clip_keeps_token_mean_and_the_demo_config_is_unchanged():
    assert load_config(CPU_YAML).algo.loss_agg == "token-mean"
    assert load_config(CPU_YAML, ["algo.loss_agg=seq-mean-token-mean"]).algo.loss_agg == "seq-mean-token-mean"


def test_dr_grpo_takes_its_constant_normaliser_and_cispo_has_no_lower_bound():
    assert load_config(CPU_YAML, ["algo.estimator=dr_grpo"]).algo.loss_agg == "seq-mean-token-sum-norm"
    algo = load_config(CPU_YAML, ["algo.policy_loss=cispo", "algo.cispo_clip_low=0.5"]).algo
    assert (algo.loss_agg, algo.cispo_clip_low) == ("token-mean", 0.5)  # set by the user: kept (and warned)


def test_two_choices_that_define_one_key_differently_are_refused_naming_both():
    with pytest.raises(ConfigError, match=r"algo.estimator=dr_grpo and algo.policy_loss=gspo define algo.loss_agg "
                                          r"differently.*set algo.loss_agg to choose"):
        load_config(CPU_YAML, ["algo.estimator=dr_grpo", "algo.policy_loss=gspo"])
    cfg = load_config(CPU_YAML, ["algo.estimator=dr_grpo", "algo.policy_loss=gspo", "algo.loss_agg=seq-mean-token-mean"])
    assert cfg.algo.loss_agg == "seq-mean-token-mean"


def test_a_plugin_declares_its_settings_the_same_way(tmp_path):
    plugin = tmp_path / "my_loss.py"
    plugin.write_text(
        "from orchestrator.algo import register_policy_loss\n"
        "from orchestrator.algo.loss import ppo_clip\n"
        "@register_policy_loss('seq_ppo', {'loss_agg': 'seq-mean-token-mean', 'clip_high': 0.2}, 'My paper, eq. 1')\n"
        "def seq_ppo(inputs, cfg):\n    return ppo_clip(inputs, cfg)\n")
    try:
        algo = load_config(CPU_YAML, ["algo.policy_loss=seq_ppo", f"algo.plugins=[{plugin}]"]).algo
        assert (algo.loss_agg, algo.clip_high) == ("seq-mean-token-mean", 0.2)
    finally:
        POLICY_LOSSES.unregister("seq_ppo")
    assert POLICY_LOSSES.settings("seq_ppo") is None


def test_malformed_settings_are_refused_at_registration_and_unknown_keys_at_load(tmp_path):
    reg: Registry = Registry("policy loss", "algo.policy_loss")
    with pytest.raises(ValueError, match="need a source"):
        reg.register("a", {"loss_agg": "token-mean"})
    with pytest.raises(ValueError, match="without the 'algo.' prefix"):
        reg.register("b", {"algo.loss_agg": "token-mean"}, "paper")
    plugin = tmp_path / "bad_key.py"
    plugin.write_text("from orchestrator.algo import register_policy_loss\n"
                      "@register_policy_loss('bad_key', {'no_such_key': 1}, 'paper')\n"
                      "def f(inputs, cfg):\n    raise AssertionError\n")
    try:
        with pytest.raises(ConfigError, match=r"algo.policy_loss=bad_key: its settings name 'no_such_key'"):
            load_config(CPU_YAML, ["algo.policy_loss=bad_key", f"algo.plugins=[{plugin}]"])
    finally:
        POLICY_LOSSES.unregister("bad_key")
