"""Non-finite and absurd numbers in a run config are refused at load, naming the key (issue 17: `trainer.lr=inf`
was accepted and turned the weights into NaN; `trainer.lr=1e30` ran "successfully")."""
from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.config.fields import check_fields, number

CPU_YAML = "configs/grpo_arith_cpu.yaml"


@pytest.mark.parametrize("override, message", [
    ("trainer.lr=inf", "trainer.lr=inf must be a finite number in (0, 1]"),
    ("trainer.lr=nan", "trainer.lr=nan must be a finite number in (0, 1]"),
    ("trainer.lr=-inf", "trainer.lr=-inf must be a finite number in (0, 1]"),
    ("trainer.lr=1e30", "trainer.lr=1e+30 must be in (0, 1]"),
    ("trainer.lr=1.5", "trainer.lr=1.5 must be in (0, 1]"),
    ("rollout.temperature=inf", "rollout.temperature=inf must be a finite number > 0"),
    ("run.phase_timeout_s=inf", "run.phase_timeout_s=inf must be a finite number > 0"),
    ("weight_sync.timeout_s=nan", "weight_sync.timeout_s=nan must be a finite number > 0"),
    ("rollout.top_p=nan", "rollout.top_p=nan must be a finite number in (0, 1]"),
    ("env.step_timeout_s=inf", "env.step_timeout_s=inf must be a finite number"),  # a field without a range
    ("trainer.betas=[0.9, .nan]", "trainer.betas[1]=nan must be a finite number"),  # a list of numbers
    ("trainer.betas=[0.9, 1.0]", "trainer.betas[1]=1.0 must be in [0, 1)"),
    ("trainer.betas=[0.9, fast]", "trainer.betas[1]='fast' must be in [0, 1)"),
    ("guards.truncated_frac=inf", "guards.truncated_frac=inf must be a finite number in (0, 1]"),
    ("guards.grad_norm_spike_factor=0.5", "guards.grad_norm_spike_factor=0.5 must be 0 (off) or > 1"),
    ("guards.kl_spike_factor=3", "guards.kl_spike_factor=3.0 watches actor/kl"),
    ("run.max_skipped_updates=-1", "run.max_skipped_updates=-1 must be >= 0"),
])
def test_non_finite_and_absurd_values_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(CPU_YAML, [override])
    assert message in str(e.value)


def test_sane_values_still_load():
    cfg = load_config(CPU_YAML, ["trainer.lr=1.0", "trainer.betas=[0.0, 0.999]", "guards.kl_spike_factor=3",
                                 "algo.kl_coef=0.01", "guards.grad_norm_spike_factor=5", "run.max_skipped_updates=0"])
    assert cfg.trainer.lr == 1.0 and cfg.guards.kl_spike_factor == 3 and cfg.run.max_skipped_updates == 0
    assert cfg.guards.action == "warn" and cfg.guards.reward_collapse_steps == 5  # the default guards warn


@dataclasses.dataclass
class Inner:
    free: float = 1.0  # no range declared
    ranged: float = number(1.0, ge=0)


@dataclasses.dataclass
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)
    values: list = dataclasses.field(default_factory=lambda: [1.0, 2.0])


def test_check_fields_refuses_non_finite_numbers_in_any_numeric_field():
    check_fields(Outer(), Outer)
    for bad, message in [(Outer(Inner(free=float("inf"))), "inner.free=inf must be a finite number"),
                         (Outer(Inner(ranged=float("nan"))), "inner.ranged=nan must be a finite number >= 0"),
                         (Outer(values=[1.0, float("-inf")]), "values[1]=-inf must be a finite number")]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            check_fields(bad, Outer)
