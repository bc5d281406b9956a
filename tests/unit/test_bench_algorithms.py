"""benchmarks/algorithms.py's pure parts: the variants name registered estimators and losses, and a run's
metrics rows summarise to first-5 / last-5 reward means and seconds per step (step 1, the warm-up, left out)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "algorithms.py"
_spec = importlib.util.spec_from_file_location("bench_algorithms", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_every_variant_names_a_registered_estimator_and_loss():
    estimators, losses = bench._registered()
    assert {"grpo", "gae", "reinforce_plus_plus"} <= estimators and {"ppo_clip", "gspo", "cispo"} <= losses
    for name, overrides in bench.VARIANTS.items():
        assert bench._missing(overrides, estimators, losses) == "", name
    assert "not registered" in bench._missing(["algo.policy_loss=nope"], estimators, losses)


def test_summarise_first_last_and_step_seconds():
    rows = [{"reward/mean": r, "timing/step_s": s} for r, s in
            zip([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], [30.0] + [10.0, 12.0] * 4 + [14.0])]
    rows.insert(3, {"eval/reward": 1.0})  # a row without reward/mean is not a step
    out = bench.summarise(rows)
    assert out["steps"] == 10
    assert out["reward_first5"] == pytest.approx(0.2) and out["reward_last5"] == pytest.approx(0.7)
    assert out["gain"] == pytest.approx(0.5)
    assert out["step_s"] == pytest.approx((10 + 12) * 4 / 9 + 14 / 9)


def test_resume_keeps_measured_variants(tmp_path, monkeypatch, capsys):
    (tmp_path / "results.json").write_text('{"grpo": {"steps": 16, "reward_first5": 0.3, "reward_last5": 0.7, '
                                           '"gain": 0.4, "step_s": 12.0, "rewards": []}}')
    monkeypatch.setattr(bench, "run_variant", lambda *a, **k: pytest.fail("a measured variant ran again"))
    assert bench.main(["--resume", "--only", "grpo", "--out", str(tmp_path)]) == 0
    assert "| grpo | (demo config) | 0.300 | 0.700 | +0.400 | 12.0 |" in capsys.readouterr().out
