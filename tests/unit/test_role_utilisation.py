"""Busy/idle time per role from a step's phase times (orchestrator/metrics/phases.py)."""
import pytest

from orchestrator.metrics.phases import role_utilisation
from orchestrator.metrics.prometheus import PrometheusExporter

ROW = {"timing/step_s": 10.0, "timing/generate_s": 4.0, "timing/reward_s": 0.5, "timing/reference_s": 1.0,
       "timing/train_s": 3.0, "timing/weight_sync_s": 1.0, "timing/checkpoint_s": 0.5}


def test_busy_and_idle_per_role_by_hand():
    out = role_utilisation(ROW)
    assert out["roles/rollout_busy_s"] == pytest.approx(5.0)  # generate 4 + sync 1
    assert out["roles/trainer_busy_s"] == pytest.approx(4.5)  # train 3 + sync 1 + checkpoint 0.5
    assert out["roles/reward_idle_frac"] == pytest.approx(0.95)
    assert out["roles/reference_idle_frac"] == pytest.approx(0.9)
    assert out["roles/trainer_idle_frac"] == pytest.approx(0.55)


def test_workers_own_generate_time_shows_their_bubble():
    out = role_utilisation(ROW, ("rollout",), generate_busy_s=2.0)  # one worker done at 1 s, one at 3 s
    assert out == {"roles/rollout_busy_s": pytest.approx(3.0), "roles/rollout_idle_frac": pytest.approx(0.7)}


@pytest.mark.parametrize("step", [None, 0.0, -1.0])
def test_a_row_without_step_time_is_refused(step):
    with pytest.raises(ValueError, match="timing/step_s"):
        role_utilisation({"timing/step_s": step} if step is not None else {})


def test_exporter_serves_role_gauges():
    from prometheus_client import generate_latest

    exporter = PrometheusExporter("127.0.0.1", 0, "t")
    try:
        exporter.log_row({"step": 1, **ROW, **role_utilisation(ROW)})
        text = generate_latest(exporter.registry).decode()
    finally:
        exporter.close()
    assert 'rl_orch_role_idle_ratio{role="trainer",run="t"} 0.55' in text
    assert 'rl_orch_role_busy_seconds{role="rollout",run="t"} 5.0' in text
    assert 'phase="rollout_busy"' not in text  # role rows are not phase histograms
