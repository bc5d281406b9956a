"""The experiment trackers with the real libraries, offline (orchestrator/metrics/trackers/): every numeric row
value read back under its name at its step (TensorBoard's event reader, MLflow's client on the local store, W&B's
offline run file), the config as hyper-parameters without secrets, a resume (SinkContext(start_step=k)) continuing
the same tracker run with no step twice, and a failing tracker leaving the run going.

    .venv/bin/python -m pytest tests/unit/test_trackers.py -q
"""
from __future__ import annotations

import json
import time
import struct
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.metrics.registry import build_sinks
from orchestrator.metrics.sink import SinkContext

ROWS = [{"step": s, "reward/mean": 0.1 * s, "timing/step_s": 2.0 + s, "actor/loss": None, "run/note": "x"}
        for s in range(1, 5)]
SAMPLES = [{"step": 4, "index": 0, "group_id": 16, "prompt": "2+3?", "completion": "5", "answer": "5", "reward": 1.0,
            "rewards": {"accuracy": 1.0}, "advantage": 0.5, "response_len": 3, "finish_reason": "stop",
            "weight_version": 3, "turns": []}]


def _cfg(out: Path, trackers: list, *extra: str):
    return load_config(None, [f"run.output_dir={out}", f"metrics.trackers={json.dumps(trackers)}", "metrics.sinks=[jsonl]",
                              "metrics.samples_every=4", "metrics.wandb.tags=[unit]", *extra])


def _run(cfg, out: Path, rows: list, start_step: int = 0, samples: bool = True) -> None:
    with build_sinks(cfg, SinkContext(out, "unit", 4, start_step)) as sinks:
        for row in rows:
            sinks.log_row(row)
            if samples and row["step"] == 4:
                sinks.log_samples(4, SAMPLES)


# ---- TensorBoard ---------------------------------------------------------------------------------------
def _tb(folder: Path):
    """TensorBoard's own reader, the one its server uses (plugin_event_accumulator: it applies purge_step to
    every kind of event, scalars and text alike)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def _scalars(acc, tag: str) -> list[tuple[int, float]]:
    from tensorboard.util import tensor_util

    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def test_tensorboard_scalars_text_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIT_SECRET_ENTITY", "do-not-log-me")
    cfg = _cfg(tmp_path, ["tensorboard"], "metrics.wandb.entity=${oc.env:UNIT_SECRET_ENTITY}")
    _run(cfg, tmp_path, ROWS)
    acc = _tb(tmp_path / "tensorboard")
    assert [(s, round(v, 6)) for s, v in _scalars(acc, "reward/mean")] == [(s, round(0.1 * s, 6)) for s in range(1, 5)]
    assert [s for s, _ in _scalars(acc, "timing/step_s")] == [1, 2, 3, 4]
    assert "actor/loss" not in acc.Tags()["tensors"] and "run/note" not in acc.Tags()["tensors"]  # None, str skipped
    texts = {t: acc.Tensors(t) for t in acc.Tags()["tensors"] if t.endswith("text_summary")}
    sample_text = texts["samples/text_summary"][0]
    assert sample_text.step == 4 and b"2+3?" in sample_text.tensor_proto.string_val[0]
    config_text = texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    assert "trainer.lr" in config_text and "do-not-log-me" not in config_text
    assert "| metrics.wandb.entity | <redacted> |" in config_text
    assert (tmp_path / "samples.jsonl").read_text().count("\n") == 1


def test_tensorboard_resume_purges_replayed_steps(tmp_path):
    cfg = _cfg(tmp_path, ["tensorboard"])
    _run(cfg, tmp_path, ROWS)  # steps 1..4 (samples at 4); the run crashes after 4, its checkpoint is step 2
    replayed = [{**r, "reward/mean": 10.0 + r["step"]} for r in ROWS[2:]]
    _run(cfg, tmp_path, replayed, start_step=2)  # resume at 2: steps 3, 4 again
    acc = _tb(tmp_path / "tensorboard")
    points = _scalars(acc, "reward/mean")
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [4]  # the sample table once too
    assert [s for s, _ in points] == [1, 2, 3, 4]  # no step twice
    assert points[2:] == [(3, 13.0), (4, 14.0)]  # the redone steps' values


# ---- MLflow --------------------------------------------------------------------------------------------
def _mlflow_client(out: Path):
    from mlflow.tracking import MlflowClient

    state = json.loads((out / "trackers.json").read_text())["mlflow"]
    return MlflowClient(tracking_uri=state["tracking_uri"]), state["run_id"]


def test_mlflow_metrics_params_and_samples_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIT_RUN_NAME", "from-env")
    cfg = _cfg(tmp_path, ["mlflow"], "metrics.mlflow.run_name=${oc.env:UNIT_RUN_NAME}")
    _run(cfg, tmp_path, ROWS)
    client, run_id = _mlflow_client(tmp_path)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.runName"] == "from-env"
    history = client.get_metric_history(run_id, "reward/mean")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(s, round(0.1 * s, 6)) for s in range(1, 5)]
    assert "actor/loss" not in run.data.metrics and "run/note" not in run.data.metrics
    assert run.data.params["trainer.lr"] == str(cfg.trainer.lr)
    assert run.data.params["metrics.mlflow.run_name"] == "<redacted>"
    assert "from-env" not in json.dumps(run.data.params)
    table = json.loads(Path(client.download_artifacts(run_id, "samples/step_000004.json", str(tmp_path / "dl"))).read_text())
    assert table["columns"][:4] == ["step", "index", "group_id", "prompt"] and table["data"][0][3] == "2+3?"


def test_mlflow_resume_continues_the_run_without_duplicates(tmp_path):
    cfg = _cfg(tmp_path, ["mlflow"])
    _run(cfg, tmp_path, ROWS[:3])  # steps 1..3 logged, checkpoint at 2
    _, first_id = _mlflow_client(tmp_path)
    _run(cfg, tmp_path, ROWS[2:], start_step=2)  # resume: 3 again (held: skipped), then 4
    client, run_id = _mlflow_client(tmp_path)
    assert run_id == first_id
    steps = [m.step for m in client.get_metric_history(run_id, "reward/mean")]
    assert sorted(steps) == [1, 2, 3, 4]
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    _run(cfg, tmp_path, ROWS[:1])  # a fresh run in the same folder (start_step 0): a new tracker run
    assert _mlflow_client(tmp_path)[1] != first_id


# ---- W&B (offline) -------------------------------------------------------------------------------------
def wandb_records(path: Path):
    """The records of a W&B offline run file (run-<id>.wandb): its LevelDB-style log of 32 KiB blocks (7-byte
    record headers: crc32, length, type), each record W&B's own protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        if pos + 7 + length > len(data):
            return  # the tail record is still being written by W&B's service process
        buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def _wandb_history(out: Path, run_id: str, expect: int = 1) -> tuple[list[dict], list]:
    """The history and run records of the offline run `run_id`, waiting (up to 60 s) until at least `expect`
    history records are there: W&B's service process writes the .wandb file on its own after finish() returns."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + 60
    while True:
        try:
            history, runs = _read_wandb(out, run_id)
        except DecodeError:  # read mid-write (CI saw it once): the file is complete by the deadline or it is corrupt
            if time.monotonic() > deadline:
                raise
            history, runs = [], []
        if len(history) >= expect or time.monotonic() > deadline:
            return history, runs
        time.sleep(0.5)


def _read_wandb(out: Path, run_id: str) -> tuple[list[dict], list]:
    history, runs = [], []
    for f in sorted((out / "wandb").glob(f"offline-run-*{run_id}*/*.wandb"), key=lambda f: f.stat().st_mtime):
        for r in wandb_records(f):
            if r.WhichOneof("record_type") == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
            elif r.WhichOneof("record_type") == "run":
                runs.append(r.run)
    return history, runs


def test_wandb_offline_run_holds_the_rows_config_and_table(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIT_SECRET_ENTITY", "do-not-log-me")
    cfg = _cfg(tmp_path, ["wandb"], "metrics.wandb.entity=${oc.env:UNIT_SECRET_ENTITY}", "metrics.wandb.project=unit")
    _run(cfg, tmp_path, ROWS)
    run_id = json.loads((tmp_path / "trackers.json").read_text())["wandb"]["run_id"]
    history, runs = _wandb_history(tmp_path, run_id, expect=4)
    assert [(h["_step"], round(h["reward/mean"], 6)) for h in history] == [(s, round(0.1 * s, 6)) for s in range(1, 5)]
    assert all("timing/step_s" in h and "actor/loss" not in h and "run/note" not in h for h in history)
    assert history[-1]["samples/_type"] == "table-file" and history[-1]["samples/nrows"] == 1
    assert runs[0].project == "unit" and list(runs[0].tags) == ["unit"]
    config = {i.key: i.value_json for i in runs[0].config.update}
    assert "trainer.lr" in config and "do-not-log-me" not in json.dumps(config)
    table = next((tmp_path / "wandb").glob("offline-run-*/files/media/table/samples_4_*.table.json"))
    assert json.loads(table.read_text())["data"][0][3] == "2+3?"


def test_wandb_resume_continues_the_same_run_id_without_duplicates(tmp_path):
    cfg = _cfg(tmp_path, ["wandb"])
    _run(cfg, tmp_path, ROWS[:3], samples=False)
    first = json.loads((tmp_path / "trackers.json").read_text())["wandb"]["run_id"]
    # W&B names an offline folder offline-run-<second>-<id>: a resume within the same second would reuse the
    # first run's folder and file (a real resume restarts actors first, seconds later)
    time.sleep(1.1)
    _run(cfg, tmp_path, ROWS[1:], start_step=1, samples=False)  # resume at 1: 2, 3 held, 4 new
    state = json.loads((tmp_path / "trackers.json").read_text())["wandb"]
    assert state["run_id"] == first and state["last_step"] == 4
    history, _ = _wandb_history(tmp_path, first, expect=4)
    steps = [h["_step"] for h in history]  # over both offline folders of the run
    assert sorted(steps) == [1, 2, 3, 4]  # no step twice


# ---- a failing tracker ---------------------------------------------------------------------------------
class _Broken:
    def __init__(self, fail_at: str):
        self.fail_at = fail_at

    def from_config(self, cfg, ctx):
        if self.fail_at == "start":
            raise ImportError("No module named 'wandb'")
        return self

    def log_row(self, row):
        if row["step"] >= 2:
            raise OSError(28, "No space left on device")

    def log_samples(self, step, samples):
        raise AssertionError("a disabled tracker is never called again")

    def close(self):
        pass


@pytest.mark.parametrize("fail_at", ["start", "log"])
def test_a_failing_tracker_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys, fail_at):
    from orchestrator.metrics import registry

    real = registry.LazyTracker
    monkeypatch.setattr(registry, "LazyTracker", lambda name: _Broken(fail_at) if name == "wandb" else real(name))
    cfg = _cfg(tmp_path, ["wandb", "tensorboard"])
    _run(cfg, tmp_path, ROWS)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING: tracker")]
    assert len(warnings) == 1 and "'wandb'" in warnings[0]
    assert ("No module named 'wandb'" if fail_at == "start" else "No space left on device") in warnings[0]
    assert [s for s, _ in _scalars(_tb(tmp_path / "tensorboard"), "reward/mean")] == [1, 2, 3, 4]  # the others go on
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 4


def test_a_bad_mlflow_server_is_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    cfg = _cfg(tmp_path, ["mlflow"], "metrics.mlflow.tracking_uri=http://127.0.0.1:9")
    _run(cfg, tmp_path, ROWS)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING: tracker")]
    assert len(warnings) == 1 and "'mlflow'" in warnings[0] and "starting" in warnings[0]


def test_unknown_tracker_is_a_config_error(tmp_path):
    from orchestrator.config.load import ConfigError

    with pytest.raises(ConfigError, match="unknown tracker.*'tensorbord'.*tensorboard"):
        _cfg(tmp_path, ["tensorbord"])
    with pytest.raises(ConfigError, match="more than once"):
        _cfg(tmp_path, ["mlflow", "mlflow"])


def test_a_supervised_restart_in_the_same_process_shows_no_step_twice(tmp_path):
    """The supervisor's path: run_steps fails (every sink gets on_error, then close), then run_steps builds the
    sinks again with the checkpoint's step (orchestrator/runtime/supervisor.py -> controller.run_steps)."""
    cfg = _cfg(tmp_path, ["tensorboard", "wandb", "mlflow"])
    with pytest.raises(RuntimeError, match="trainer died"):
        with build_sinks(cfg, SinkContext(tmp_path, "unit", 4, 0)) as sinks:
            for row in ROWS[:3]:
                sinks.log_row(row)
            raise RuntimeError("trainer died")
    ids = {k: v["run_id"] for k, v in json.loads((tmp_path / "trackers.json").read_text()).items()}
    _run(cfg, tmp_path, ROWS[1:], start_step=1)  # restarted from the step-1 checkpoint: 2, 3 redone, then 4
    state = json.loads((tmp_path / "trackers.json").read_text())
    assert {k: v["run_id"] for k, v in state.items()} == ids and state["mlflow"]["last_step"] == 4
    assert [s for s, _ in _scalars(_tb(tmp_path / "tensorboard"), "reward/mean")] == [1, 2, 3, 4]
    client, run_id = _mlflow_client(tmp_path)
    assert sorted(m.step for m in client.get_metric_history(run_id, "reward/mean")) == [1, 2, 3, 4]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert sorted(h["_step"] for h in _wandb_history(tmp_path, ids["wandb"], expect=4)[0]) == [1, 2, 3, 4]
