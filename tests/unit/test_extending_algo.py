"""The algorithm seam's worked examples: docs/examples/custom_estimator.py and custom_loss.py.

Each example is one file that registers itself; importing it (as `algo.plugins` does) is all it takes
for the config to accept its name and for the trainer to use it. Values are hand-computed; the loss
checks correctness case C14 for both branches (PPO-clip and CISPO).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from orchestrator.algo import (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, AdvantageConfig, AdvantageInputs, LossConfig,
                               LossInputs, compute_policy_loss, compute_token_advantages, import_plugins)
from orchestrator.algo.registry import plugin_module_name
from orchestrator.config import ConfigError, load_config
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import random_batch, save_tiny_llama

REPO = Path(__file__).resolve().parents[2]
ESTIMATOR_FILE = REPO / "docs" / "examples" / "custom_estimator.py"
LOSS_FILE = REPO / "docs" / "examples" / "custom_loss.py"
CPU_YAML = REPO / "configs" / "grpo_arith_cpu.yaml"


@pytest.fixture(autouse=True)
def clean_registries():
    """Each test starts without the examples registered and leaves the registries as it found them."""
    before = {reg: set(reg.names()) for reg in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES)}
    yield
    for reg, names in before.items():
        for name in set(reg.names()) - names:
            reg.unregister(name)
    for path in (ESTIMATOR_FILE, LOSS_FILE):
        sys.modules.pop(plugin_module_name(path), None)


# ---- estimator: REINFORCE++ ---------------------------------------------------------------------------
def test_reinforce_pp_hand_values() -> None:
    import_plugins([str(ESTIMATOR_FILE)])
    # rewards [1, 0]; sample 0 has 2 response tokens, sample 1 has 1. Returns (gamma = 1): [1, 1] and [0].
    # mean 2/3, unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3); A = centred / std.
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask)
    adv = compute_token_advantages("reinforce_pp", inputs, AdvantageConfig(adv_eps=0.0))
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(adv, torch.tensor([[1 / 3 / s, 1 / 3 / s, 0.0], [-2 / 3 / s, 0.0, 0.0]]),
                               atol=1e-5, rtol=0)
    assert adv[0, 0].item() == pytest.approx(0.577350, abs=1e-5)
    assert adv[1, 0].item() == pytest.approx(-1.154701, abs=1e-5)
    assert adv.shape == (2, 3) and adv.dtype == torch.float32


def test_reinforce_pp_per_token_rewards_and_uniform_batch() -> None:
    import_plugins([str(ESTIMATOR_FILE)])
    mask = torch.tensor([[1, 1, 1]])
    # token rewards [0, 1, 0.5] -> returns [1.5, 1.5, 0.5]: mean 7/6, std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2)
    tokens = torch.tensor([[0.0, 1.0, 0.5]])
    adv = compute_token_advantages("reinforce_pp", AdvantageInputs(torch.zeros(1), torch.zeros(1, dtype=torch.long),
                                                                   mask, token_rewards=tokens), AdvantageConfig(0.0))
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(adv, torch.tensor([[1 / 3 / s, 1 / 3 / s, -2 / 3 / s]]), atol=1e-5, rtol=0)
    # every return equal: exactly 0, never NaN
    uniform = AdvantageInputs(torch.tensor([1.0, 1.0]), torch.tensor([0, 1]), torch.tensor([[1, 0], [1, 0]]))
    assert torch.equal(compute_token_advantages("reinforce_pp", uniform, AdvantageConfig()), torch.zeros(2, 2))


def test_config_accepts_the_estimator_once_imported() -> None:
    with pytest.raises(ConfigError, match=r"algo.estimator='reinforce_pp'.*'grpo'.*'rloo'.*'dr_grpo'"):
        load_config(CPU_YAML, ["algo.estimator=reinforce_pp"])
    cfg = load_config(CPU_YAML, ["algo.estimator=reinforce_pp", f"algo.plugins=[{ESTIMATOR_FILE}]"])
    assert cfg.algo.estimator == "reinforce_pp"
    assert load_config(CPU_YAML, ["algo.estimator=reinforce_pp"]).algo.estimator == "reinforce_pp"  # now registered


def test_a_missing_plugin_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"algo.plugins\[0\]='no_such_module_xyz'"):
        load_config(CPU_YAML, ["algo.plugins=[no_such_module_xyz]"])


# ---- loss: CISPO, and case C14 --------------------------------------------------------------------------
def _one_token(policy_loss: str, old_p: float, new_p: float, adv: float, **cfg) -> tuple[float, float, dict]:
    lp = torch.tensor([[math.log(new_p)]], requires_grad=True)
    inputs = LossInputs(lp, torch.tensor([[math.log(old_p)]]), torch.tensor([[adv]]), torch.ones(1, 1), 1.0)
    loss, metrics = compute_policy_loss(inputs, LossConfig(policy_loss=policy_loss, **cfg))
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.item(), grad.item(), metrics


def test_c14_ppo_clip_branch() -> None:
    loss, grad, m = _one_token("ppo_clip", 0.4, 0.6, 1.0, clip_low=0.2, clip_high=0.2)  # ratio 1.5 > 1.2
    assert loss == pytest.approx(-1.2, abs=1e-5)
    assert grad == 0.0  # clipped: the token leaves the gradient
    assert m["actor/clip_frac"] == 1.0


def test_c14_cispo_branch() -> None:
    import_plugins([str(LOSS_FILE)])
    loss, grad, m = _one_token("cispo_example", 0.4, 0.2, -1.0, clip_high=4.0)  # ratio 0.5, weight cap 5.0
    assert loss == pytest.approx(0.5 * math.log(0.2), abs=1e-5)  # -0.804719
    assert loss == pytest.approx(-0.804719, abs=1e-5)
    assert grad == pytest.approx(0.5, abs=1e-5)  # no token leaves the gradient
    assert m["actor/ratio_mean"] == pytest.approx(0.5, abs=1e-6) and m["actor/clip_frac"] == 0.0
    # above the cap the weight is 5.0 and still carries a gradient: -5 * A
    loss, grad, m = _one_token("cispo_example", 0.1, 0.8, 1.0, clip_high=4.0)  # ratio 8
    assert grad == pytest.approx(-5.0, abs=1e-5) and m["actor/clip_frac"] == 1.0


def test_config_and_trainer_use_the_loss_from_algo_plugins(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"algo.policy_loss='cispo_example'.*'ppo_clip'"):
        load_config(CPU_YAML, ["algo.policy_loss=cispo_example"])
    assert load_config(CPU_YAML, ["algo.policy_loss=cispo_example", f"algo.plugins=[{LOSS_FILE}]"]).algo.policy_loss == "cispo_example"
    POLICY_LOSSES.unregister("cispo_example")  # a trainer actor is a fresh process: it imports algo.plugins itself
    sys.modules.pop(plugin_module_name(LOSS_FILE), None)
    from actors.trainer.trainer import Trainer

    folder = save_tiny_llama(tmp_path / "tiny")
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-2, "warmup_steps": 0, "micro_batch_size": 4, "num_threads": 1, "precision": "fp32"})
    algo = OmegaConf.structured(AlgoConfig)
    algo.update({"policy_loss": "cispo_example", "clip_high": 4.0, "plugins": [str(LOSS_FILE)]})
    m = Trainer(str(folder), tc, algo, temperature=1.0, max_new_tokens=8).train_step(random_batch(8))
    assert "cispo_example" in POLICY_LOSSES
    assert math.isfinite(m["actor/loss"]) and m["actor/grad_norm"] > 0


def test_two_plugin_files_of_one_name_both_load(tmp_path) -> None:
    for folder, name in (("a", "alpha_pg"), ("b", "beta_pg")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "losses.py").write_text(
            "from orchestrator.algo.loss import POLICY_LOSSES, register_policy_loss\n"
            f"@register_policy_loss({name!r})\n"
            "def _loss(inputs, cfg):\n    raise NotImplementedError\n")
    try:
        cfg = load_config(CPU_YAML, ["algo.policy_loss=beta_pg",
                                     f"algo.plugins=[{tmp_path / 'a' / 'losses.py'}, {tmp_path / 'b' / 'losses.py'}]"])
        assert cfg.algo.policy_loss == "beta_pg" and "alpha_pg" in POLICY_LOSSES
    finally:
        for name in ("alpha_pg", "beta_pg"):
            POLICY_LOSSES.unregister(name)


def test_a_plugin_that_raises_is_a_config_error_naming_it(tmp_path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("1 / 0\n")
    with pytest.raises(ConfigError, match=r"algo.plugins\[0\]='.*broken.py': importing it raised ZeroDivisionError"):
        load_config(CPU_YAML, [f"algo.plugins=[{bad}]"])
    missing = tmp_path / "needs_dep.py"
    missing.write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ConfigError, match=r"algo.plugins\[0\]=.*needs_dep.py.*no_such_dependency_xyz"):
        load_config(CPU_YAML, [f"algo.plugins=[{missing}]"])
