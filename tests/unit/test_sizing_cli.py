"""`rl-orch size` through orchestrator.cli.main: synthetic runs at two sizes (the fit and the
recommendation match the known laws), a real CPU run's metrics, and the error exits."""
import json
import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.sizing.measurements import measure_run
from orchestrator.sizing.scaling import Law
from orchestrator.sizing.sizer import size
from orchestrator.sizing.workload import Workload

REAL_RUN = Path(__file__).parent / "sizing_data" / "cpu_run_metrics.jsonl"  # 16 steps of the default CPU run

# The synthetic cluster: generate 2 + 64/g, train 80/g^0.8, sync 3 + 0.25 g, reward 0.5, checkpoint 0.2
GEN, TRAIN, SYNC = Law(2, 64, 1), Law(0, 80, 0.8), Law(3, 0.25, -1)


def write_run(folder: Path, rollout: int, trainer: int, config: bool = True) -> Path:
    """metrics.jsonl of 5 steps (the first a slow warm-up; the others jittered +-5% around the laws, so
    the median is exact) and, when `config`, a config.yaml with the role counts."""
    folder.mkdir(parents=True)
    rows = []
    for step, jitter in enumerate([3.0, 1.0, 0.95, 1.05, 1.0], 1):
        rows.append({"step": step, "rollout/tokens": 1000, "timing/generate_s": GEN(rollout) * jitter,
                     "timing/train_s": TRAIN(trainer) * jitter, "timing/weight_sync_s": SYNC(rollout) * jitter,
                     "timing/reward_s": 0.5, "timing/reference_s": 0.0, "timing/checkpoint_s": 0.2,
                     "timing/sample_s": 0.0, "timing/advantages_s": 0.0, "timing/step_s": 1.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config:
        (folder / "config.yaml").write_text(f"rollout:\n  num_workers: {rollout}\ntrainer:\n  num_workers: {trainer}\n"
                                            "algo:\n  kl_coef: 0.0\n")
    return folder / "metrics.jsonl"


def predicted(out: str) -> float:
    return float(re.search(r"predicted step time: ([0-9.e+]+) s", out).group(1))


def test_two_sizes_fit_the_laws_and_the_recommendation_matches(tmp_path, capsys):
    a, b = write_run(tmp_path / "a", 2, 2), write_run(tmp_path / "b", 8, 4)
    assert main(["size", "--metrics", str(a), "--metrics", str(b), "--gpus", "64"]) == 0
    out = capsys.readouterr().out
    assert "t(g) = 2 + 64/g s" in out  # generate, fitted exactly
    assert "t(g) = 0 + 80/g^0.8 s" in out  # train: power law through both sizes
    assert "t(g) = 3 + 0.25*g s" in out  # sync grows with the receivers
    assert "4 of 5 steps (first dropped as warm-up)" in out
    truth = Workload(GEN, TRAIN, SYNC, reward_s=0.5, checkpoint_s=0.2)
    best = size(truth, 64).best
    assert f"recommendation for 64 GPUs: {best.split.describe(truth)}" in out
    assert predicted(out) == pytest.approx(best.step_s, rel=1e-3)
    assert "runner-ups:" in out and "equal split (async: rollout 32, trainer 32)" in out
    assert re.search(r"searched: \d+ splits simulated of 253 valid", out)  # 64 colocated + 63 x 3 (dis, async, stream)
    assert "colocated: wake/sleep switch cost not measured" in out


def test_mode_and_units_and_target(tmp_path, capsys):
    a = write_run(tmp_path / "a", 2, 2)
    assert main(["size", "--metrics", str(a), "--gpus", "64", "--mode", "disaggregated", "--tp", "4",
                 "--trainer-unit", "8"]) == 0
    out = capsys.readouterr().out
    split = re.search(r"recommendation for 64 GPUs: disaggregated: rollout (\d+) \((\d+) engines x TP 4\), "
                      r"trainer (\d+)", out)
    assert split and int(split.group(1)) % 4 == 0 and int(split.group(3)) % 8 == 0
    assert "async" not in out.split("runner-ups:")[1].split("equal split")[0]
    assert main(["size", "--metrics", str(a), "--target-step-s", "20", "--gpus", "256"]) == 0
    out = capsys.readouterr().out
    n = int(re.search(r"fewest GPUs for a step of at most 20 s: (\d+)", out).group(1))
    assert predicted(out) <= 20 and f"recommendation for {n} GPUs" in out


def test_stream_mode_prints_its_k_and_config_keys(tmp_path, capsys):
    """Fully asynchronous with partial rollouts: the k chosen, the keys to set, every k simulated, and the
    median generate time every step with --constant-generate (then k = 1 reaches the overlap limit)."""
    a = write_run(tmp_path / "a", 2, 2)
    assert main(["size", "--metrics", str(a), "--gpus", "16", "--mode", "stream", "--max-k", "3",
                 "--constant-generate"]) == 0
    out = capsys.readouterr().out
    k = int(re.search(r"recommendation for 16 GPUs: stream: rollout \d+, trainer \d+, k = (\d+)", out).group(1))
    assert 1 <= k <= 3 and "generate varies from step to step" not in out
    assert f"config: placement.mode=disaggregated rollout.mode=stream algo.max_staleness={k}" in out
    assert "step time per k: k=1 " in out and "k = 1 already reaches the overlap limit" in out
    assert main(["size", "--metrics", str(a), "--gpus", "16", "--mode", "stream"]) == 0
    assert "generate varies from step to step: cv " in capsys.readouterr().out  # the +-5% jitter of the rows


def test_real_cpu_run(capsys):
    """The default CPU run (SmolLM2-135M, 2 cores): one rollout worker, one trainer, no reference."""
    m = measure_run(REAL_RUN, "rollout=1,trainer=1")
    assert (m.steps_used, m.steps_total) == (15, 16)
    assert 5 < m.phases["generate"] < 60 and 5 < m.phases["train"] < 60  # seconds per step on 2 CPU cores
    assert main(["size", "--metrics", str(REAL_RUN), "--measured-gpus", "rollout=1,trainer=1", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "measured at 1 GPUs only: assumed exponent 1" in out
    assert predicted(out) < m.phases["generate"] + m.phases["train"] + m.phases["sync"]  # 8 devices beat 2


@pytest.mark.parametrize("extra,message", [
    (["--gpus", "1", "--mode", "disaggregated"], "1 is fewer than the 2"),
    (["--gpus", "8", "--measured-gpus", "rollout=1"], "missing trainer"),
    (["--gpus", "8", "--measured-gpus", "rollout=1,trainer=x"], "trainer='x' is not an integer"),
    (["--gpus", "8", "--measured-gpus", "rollout=1,critic=1"], "unknown role 'critic'"),
    (["--gpus", "8", "--measured-gpus", "rollout=1,trainer=1", "--measured-gpus", "rollout=1,trainer=1"],
     "given 2 time(s) for 1 --metrics"),
    (["--measured-gpus", "rollout=1,trainer=1"], "--gpus: required"),
    (["--gpus", "8", "--tp", "0"], "--tp: must be >= 1"),
    (["--target-step-s", "0.001", "--gpus", "16"], "not reachable with 16 GPUs"),
    (["--gpus", "8", "--max-k", "0"], "--max-k: must be >= 1"),
    (["--gpus", "8", "--recompute-s", "-1"], "--recompute-s: must be >= 0"),
])
def test_bad_input_exits_2(tmp_path, capsys, extra, message):
    a = write_run(tmp_path / "a", 2, 2)
    assert main(["size", "--metrics", str(a), *extra]) == 2
    assert message in capsys.readouterr().err


def test_metrics_problems_exit_2(tmp_path, capsys):
    no_cfg = write_run(tmp_path / "nocfg", 1, 1, config=False)
    assert main(["size", "--metrics", str(no_cfg), "--gpus", "8"]) == 2
    assert "pass --measured-gpus" in capsys.readouterr().err
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert main(["size", "--metrics", str(bare), "--measured-gpus", "rollout=1,trainer=1", "--gpus", "8"]) == 2
    assert "no step row has the timing keys timing/generate_s, timing/train_s" in capsys.readouterr().err
    assert main(["size", "--metrics", str(tmp_path / "missing.jsonl"), "--gpus", "8"]) == 2
    assert "no such file" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    assert main(["size", "--metrics", str(broken), "--gpus", "8"]) == 2
    assert "line 1 is not JSON" in capsys.readouterr().err


def test_sync_from_the_cost_model(tmp_path, capsys):
    a = write_run(tmp_path / "a", 2, 2)
    assert main(["size", "--metrics", str(a), "--gpus", "64", "--sync-params", "7e9", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "sync (replaces the measured one)" in out and "cost model (nccl, 7e+09 params, nvlink/ib400)" in out
    assert main(["size", "--metrics", str(a), "--gpus", "64", "--sync-params", "7e9", "--inter", "carrier"]) == 2
    assert "--inter: unknown fabric 'carrier'" in capsys.readouterr().err


def test_far_extrapolation_and_a_sync_bound_step_are_flagged(tmp_path, capsys):
    argv = ["size", "--metrics", str(REAL_RUN), "--measured-gpus", "rollout=1,trainer=1"]
    assert main(argv + ["--gpus", "8"]) == 0
    assert "warning:" not in capsys.readouterr().out  # 8 GPUs from a 2-GPU run: generate/train still dominate
    assert main(argv + ["--gpus", "100000"]) == 0
    out = capsys.readouterr().out
    assert "extrapolated to 100000" in out and "warning: sync-bound" in out
    rows = [json.loads(line) for line in REAL_RUN.read_text().splitlines()]
    no_sync = tmp_path / "metrics.jsonl"
    no_sync.write_text("\n".join(json.dumps({k: v for k, v in r.items() if k != "timing/weight_sync_s"}) for r in rows))
    assert main(["size", "--metrics", str(no_sync), "--measured-gpus", "rollout=1,trainer=1", "--gpus", "8"]) == 0
    assert "has no timing for sync: counted as 0 s" in capsys.readouterr().out


def test_async_rows_are_measured_by_their_whole_generation_time():
    from orchestrator.sizing.measurements import measure_rows

    rows = [{"timing/generate_s": 0.01, "async/generate_s": g, "timing/train_s": 5.0} for g in (9.0, 3.0, 4.0)]
    m = measure_rows(rows, {"rollout": 1, "trainer": 1, "reference": 0}, "x", "test", {})
    assert m.phases["generate"] == 3.5  # median of the whole generations of steps 2-3, not the 0.01 s waits
    sync = [{"timing/generate_s": g, "timing/train_s": 5.0} for g in (9.0, 3.0, 4.0)]
    assert measure_rows(sync, {"rollout": 1, "trainer": 1, "reference": 0}, "x", "test", {}).phases["generate"] == 3.5
