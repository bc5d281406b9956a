"""benchmarks/async_rl.py's pure parts: the batch clock and the policy clock of "wall time to the reward"
(a batch generated k versions back measures the policy k steps older), and the table's ratios."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "async_rl.py"
_spec = importlib.util.spec_from_file_location("bench_async_rl", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

REWARDS = [0.2, 0.4, 0.6, 0.8, 0.8, 0.8]


def _rows(step_s: float, extra: list[dict]) -> list[dict]:
    return [{"step": i + 1, "reward/mean": r, "timing/step_s": step_s, "timing/generate_s": 1.0,
             "timing/train_s": 2.0, **extra[i]} for i, r in enumerate(REWARDS)]


def test_synchronous_rows_time_the_policy_one_step_before_the_batch():
    out = bench.summarise(_rows(10.0, [{}] * 6), target=0.6)
    assert out["versions"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # step s trains on version s - 1
    assert out["wall_to_target_s"] == 40.0  # window of steps 2-4: mean 0.6, step 4 ends at 40 s
    assert out["policy_to_target_s"] == 20.0  # their versions 1, 2, 3: version 2 exists after step 2


def test_streaming_rows_use_the_mean_token_version_and_interpolate():
    stale = [{"async/policy_version_mean": v} for v in (0.0, 0.0, 0.5, 1.5, 2.5, 3.5)]
    out = bench.summarise(_rows(10.0, stale), target=0.6)
    assert out["wall_to_target_s"] == 40.0
    assert out["policy_to_target_s"] == pytest.approx(6.667, abs=1e-3)  # version (0 + 0.5 + 1.5) / 3 = 2/3 of step 1


def test_one_step_off_rows_subtract_their_staleness():
    out = bench.summarise(_rows(10.0, [{"async/staleness": 0.0}] + [{"async/staleness": 1.0}] * 5), target=0.6)
    assert out["versions"] == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]


def test_never_reached_is_none_and_the_table_says_so():
    out = bench.summarise(_rows(10.0, [{}] * 6), target=0.95)
    assert out["wall_to_target_s"] is None and out["policy_to_target_s"] is None
    sync = bench.summarise(_rows(10.0, [{}] * 6), target=0.6)
    fast = bench.summarise(_rows(5.0, [{}] * 6), target=0.6)
    text = bench.table({"sync_disaggregated": sync, "k1": fast, "k2": out}, 0.6)
    assert "| k1 |" in text and "20 (2.00x)" in text and "10 (2.00x)" in text  # both clocks, vs the sync mode
    assert text.count("not reached") == 2  # k2 on both clocks


def test_the_final_checkpoint_write_is_not_step_time():
    rows = _rows(10.0, [{}] * 5 + [{"timing/step_s": 19.0, "timing/checkpoint_s": 9.0}])  # the final checkpoint
    out = bench.summarise(rows, target=0.6)
    assert out["step_s"] == 10.0 and out["wall"][-1] == 60.0


def test_seeds_aggregate_each_seeds_ratio_their_median_and_the_summed_times():
    """Two seeds: k1 reaches the reward 2x sooner in seed 0 and 1.25x in seed 1 (against that seed's synchronous
    run); summed, 300 s against 180 s; a seed where k1 never reaches it counts in no ratio."""
    def run(step_s, wall, policy):
        return {"step_s": step_s, "generate_s": 8.0, "train_s": 10.0, "wall_to_target_s": wall,
                "policy_to_target_s": policy}
    per_seed = {0: {"sync_disaggregated": run(20.0, 100.0, 80.0), "k1": run(10.0, 50.0, 40.0)},
                1: {"sync_disaggregated": run(20.0, 200.0, 150.0), "k1": run(11.0, 160.0, 100.0)},
                2: {"sync_disaggregated": run(20.0, 100.0, 80.0), "k1": run(10.0, None, None)}}
    k1 = next(line for line in bench.aggregate(per_seed, 0.7).splitlines() if line.startswith("| k1 "))
    cells = [c.strip() for c in k1.strip("|").split("|")]
    assert cells[1] == "0,1,2" and cells[2] == "2.00x (median)"
    assert cells[3:6] == ["2.00x / 1.25x / not reached", "1.62x", "1.43x"]  # 300 / 210
    assert cells[6:9] == ["2.00x / 1.50x / not reached", "1.75x", "1.64x"]  # 230 / 140
    assert cells[9] == "1.00 / 1.10 / 1.00"  # step / max(generation 8 s, training 10 s) of the synchronous run
    assert bench.seed_overrides(3) == ["run.seed=3", "rollout.seed=3", "data.seed=3"]
