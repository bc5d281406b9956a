"""Eval rows in every sink: metrics.jsonl (a fresh start drops an old step-0 eval row), Prometheus
(rl_orch_eval_value, the eval phase), the console table, and the plot's eval panel."""
from __future__ import annotations


from prometheus_client import generate_latest

from orchestrator.metrics.console import ConsoleProgress
from orchestrator.metrics.jsonl import JsonlLogger, read_jsonl
from orchestrator.metrics.plot import plot_run
from orchestrator.metrics.prometheus import PrometheusExporter

EVAL0 = {"step": 0, "eval/pass_at_1": 0.5, "eval/maj_at_1": 0.5, "timing/eval_s": 3.0}
STEP1 = {"step": 1, "reward/mean": 0.6, "timing/generate_s": 2.0, "timing/train_s": 1.0, "timing/step_s": 3.5}
STEP2 = {**STEP1, "step": 2, "eval/pass_at_1": 0.75, "eval/maj_at_1": 0.75, "timing/eval_s": 2.5}


def test_jsonl_fresh_start_drops_every_row_and_resume_keeps_step_0(tmp_path):
    log = JsonlLogger(tmp_path / "m.jsonl")
    for r in (EVAL0, STEP1, STEP2):
        log.log_row(r)
    log.keep_steps_up_to(1)  # a resume after step 1: the step-0 eval stays
    assert [r["step"] for r in read_jsonl(log.path)] == [0, 1]
    log.keep_steps_up_to(0)  # a fresh start (or a restart from the base model): nothing old stays
    assert read_jsonl(log.path) == []


def test_prometheus_serves_eval_values_and_the_eval_phase():
    exporter = PrometheusExporter("127.0.0.1", 0, "t")
    try:
        exporter.log_row(EVAL0)
        text = generate_latest(exporter.registry).decode()
    finally:
        exporter.close()
    assert 'rl_orch_eval_value{name="pass_at_1",run="t"} 0.5' in text
    assert 'rl_orch_phase_seconds_count{phase="eval",run="t"} 1.0' in text


def test_console_shows_eval_columns_and_step_0_does_not_advance_the_bar():
    line = ConsoleProgress.format_row(STEP2)
    assert "0.750" in line and "2.5" in line
    console = ConsoleProgress(total_steps=2, enabled=False)
    console.log_row(EVAL0)
    console.log_row(STEP1)
    assert console.progress.tasks[0].completed == 1


def test_plot_has_an_eval_panel(tmp_path):
    import matplotlib.image

    with_eval = plot_run([EVAL0, STEP1, STEP2], tmp_path / "e.png")
    without = plot_run([STEP1, {**STEP1, "step": 2}], tmp_path / "p.png")
    assert matplotlib.image.imread(with_eval).shape[0] > matplotlib.image.imread(without).shape[0]  # 3 panels, taller


def test_console_stale_column_shows_the_staleness_of_either_async_mode():
    """one_step_off rows carry `async/staleness`; stream rows `async/staleness_max` (the batch's oldest sample)."""
    from orchestrator.metrics.console import COLUMNS

    stale_at = [h for h, _, _ in COLUMNS].index("stale")

    def cell(row: dict) -> str:
        return ConsoleProgress.format_row({"step": 3, **row}).split()[stale_at]

    assert cell({"async/staleness": 1.0}) == "1"
    assert cell({"async/staleness_max": 2.0, "async/staleness_mean": 0.5}) == "2"
    assert cell({"async/staleness": 0.0, "async/staleness_max": 2.0}) == "0"  # the mode's own key first
    assert cell({}) == "-"
