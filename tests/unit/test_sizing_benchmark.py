"""benchmarks/sizing.py (issue 5): the pure parts (step seconds, warm-up, ratios, errors, table) on
hand-computed rows; no run is started."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("sizing_bench_test", REPO / "benchmarks" / "sizing.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


sb = _module()


def test_step_seconds_drops_the_checkpoint_and_sorts_by_step() -> None:
    rows = [{"step": 2, "timing/step_s": 5.0}, {"step": 1, "timing/step_s": 9.0},
            {"step": 3, "timing/step_s": 7.5, "timing/checkpoint_s": 2.5}, {"note": "no timing"}]
    assert sb.step_seconds(rows) == [9.0, 5.0, 5.0]


def test_step_seconds_without_timing_is_an_error() -> None:
    with pytest.raises(ValueError, match="timing/step_s"):
        sb.step_seconds([{"step": 1}])


def test_without_checkpoint_leaves_other_keys() -> None:
    assert sb.without_checkpoint([{"timing/checkpoint_s": 1.0, "timing/train_s": 2.0}]) == [{"timing/train_s": 2.0}]


def test_summary_ratios_and_errors_hand_computed() -> None:
    # equal: runs [warm 20, 10, 12] and [warm 30, 11] -> steps 10, 12, 11 -> mean 11
    # sizer: [warm 9, 5, 6] -> 5.5; async: [warm 9, 8] -> 8
    measured = {"eq": [[20.0, 10.0, 12.0], [30.0, 11.0]], "sz": [[9.0, 5.0, 6.0]], "as": [[9.0, 8.0]]}
    predicted = {"eq": 12.1, "sz": 5.0, "as": 8.8}
    res = sb.summarise(measured, predicted, {"equal": "eq", "sizer": "sz", "async": "as"})
    rows = {r["placement"]: r for r in res["rows"]}
    assert rows["eq"]["measured_s"] == pytest.approx(11.0)
    assert rows["eq"]["measured_sd"] == pytest.approx(1.0)  # sample sd of 10, 12, 11
    assert (rows["eq"]["steps"], rows["eq"]["runs"]) == (3, 2)
    assert rows["eq"]["error"] == pytest.approx(0.1)  # 12.1 / 11 - 1
    assert rows["sz"]["error"] == pytest.approx(5.0 / 5.5 - 1)
    assert res["equal_over_sizer"] == pytest.approx(2.0)
    assert res["sync_over_async"] == pytest.approx(11.0 / 8.0)
    assert res["worst_error"] == pytest.approx(0.1)
    assert res["targets"]["sizer_met"] is True and res["targets"]["error_met"] is True


def test_summary_misses_targets_and_single_step_runs_keep_their_step() -> None:
    res = sb.summarise({"eq": [[10.0]], "sz": [[12.0, 9.0]]}, {"eq": 6.0}, {"equal": "eq", "sizer": "sz"})
    assert res["equal_over_sizer"] == pytest.approx(10.0 / 9.0)
    assert res["sync_over_async"] is None
    assert res["worst_error"] == pytest.approx(0.4)  # |6/10 - 1|; sz has no prediction
    assert res["targets"] == {"sizer_speedup": 1.2, "max_error": 0.15, "sizer_met": False, "error_met": False}


def test_summary_names_an_unmeasured_role() -> None:
    with pytest.raises(ValueError, match="role 'async'"):
        sb.summarise({"eq": [[1.0, 1.0]]}, {}, {"equal": "eq", "async": "as"})


def test_markdown_table_rows_and_verdicts() -> None:
    res = sb.summarise({"eq": [[20.0, 10.0, 12.0]], "sz": [[9.0, 5.0, 6.0]], "as": [[9.0, 8.0]]},
                       {"eq": 12.1, "sz": 5.0}, {"equal": "eq", "sizer": "sz", "async": "as"})
    text = sb.markdown(res)
    assert "| eq | 11.00 ± 1.41 (2) | 12.10 | +10.0% |" in text
    assert "| as | 8.00 ± 0.00 (1) | - | - |" in text
    assert "equal / sizer: 2.00x (target >= 1.2x: met)" in text
    assert "sync / async: 1.38x" in text
    assert "worst |prediction error| (all): 10.0% (target <= 15%: met)" in text


def test_in_sample_rows_are_shown_but_not_judged() -> None:
    """The sizer fitted to runs eq and co: their errors are in-sample; the target is judged on sz only."""
    res = sb.summarise({"eq": [[0.0, 10.0]], "co": [[0.0, 8.0]], "sz": [[0.0, 5.0]]},
                       {"eq": 10.0, "co": 12.0, "sz": 5.5}, {"equal": "eq", "sizer": "sz"},
                       in_sample=frozenset({"eq", "co"}))
    assert [r["in_sample"] for r in res["rows"]] == [True, True, False]
    assert res["worst_error"] == pytest.approx(0.10)  # sz: 5.5 / 5 - 1; co's +50% is in-sample
    text = sb.markdown(res)
    assert "| co (fitted to it) | 8.00 ± 0.00 (1) | 12.00 | +50.0% |" in text
    assert "worst |prediction error| (placements the fit did not see): 10.0%" in text


def test_step_seconds_drop_last_for_async_runs() -> None:
    rows = [{"step": 1, "timing/step_s": 9.0}, {"step": 2, "timing/step_s": 6.0},
            {"step": 3, "timing/step_s": 3.5, "timing/checkpoint_s": 0.5}]
    assert sb.step_seconds(rows, drop_last=True) == [9.0, 6.0]
    with pytest.raises(ValueError, match="at least 2 steps"):
        sb.step_seconds(rows[:1], drop_last=True)
