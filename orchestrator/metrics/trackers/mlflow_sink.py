"""MLflow (`metrics.trackers: [mlflow]`, section `metrics.mlflow`): by default a local folder store
<run.output_dir>/mlruns (`mlflow ui --backend-store-uri file:runs/<name>/mlruns`, the full `mlflow` package),
or any tracking URI (a server `http://host:5000`, `sqlite:///mlflow.db`; credentials from MLflow's own
environment variables, never from the run config). docs/trackers.md.

Every numeric row value is a metric under its row name at the row's step; the config is the run's params
(secrets left out); completion samples are a JSON table artifact `samples/step_<k>.json` ({"columns", "data"}:
the layout of MLflow's log_table). The run id is kept in <run.output_dir>/trackers.json: a resume continues that
run and skips the steps it already holds (common.StepGate), so no step appears twice.
"""
from __future__ import annotations

import os
import time

from orchestrator.metrics.samples import table_rows
from orchestrator.metrics.sink import MetricSink, SinkContext
from orchestrator.metrics.trackers.common import StepGate, TrackerState, numeric_items, out_path, run_hparams

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
BATCH = 100  # MLflow's limit on params per log_batch call (metrics: 1000)


def tracking_uri(setting: str, out_dir) -> str:
    """`setting`, or the local folder store `file:<out_dir>/mlruns` when it is ""."""
    return setting or out_path("", out_dir, "mlruns").resolve().as_uri()


class MlflowSink(MetricSink):
    """One MLflow run for the whole training run (continued on resume), through MlflowClient (no global state)."""

    def __init__(self, cfg, ctx: SinkContext):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        m = cfg.metrics.mlflow
        uri = tracking_uri(m.tracking_uri, ctx.out_dir)
        if uri.startswith("file:"):  # MLflow 3 asks for this opt-in to use a local folder store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.state = TrackerState(ctx.out_dir, "mlflow")
        run_id, last_step = self.state.resume(ctx.start_step)
        if run_id is None:
            exp = self.client.get_experiment_by_name(m.experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(m.experiment)
            run_id = self.client.create_run(exp_id, run_name=m.run_name or ctx.run_name).info.run_id
            params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in run_hparams(cfg).items()]
            for i in range(0, len(params), BATCH):
                self.client.log_batch(run_id, params=params[i:i + BATCH])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.state.put(run_id=run_id, last_step=last_step, tracking_uri=uri)
        self.gate = StepGate(self.state, last_step)

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> "MlflowSink":
        return cls(cfg, ctx)

    def log_row(self, row: dict) -> None:
        from mlflow.entities import Metric

        step = int(row["step"])
        if self.gate.admit(step):
            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, step) for k, v in numeric_items(row).items()]
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_samples(self, step: int, samples: list[dict]) -> None:
        if self.gate.holds(step):  # a step the resume redoes: the run already holds its samples
            return
        columns, rows = table_rows(samples)
        self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, f"samples/step_{step:06d}.json")

    def on_error(self, exc: BaseException) -> None:
        self.client.set_terminated(self.run_id, status="FAILED")
        self.run_id = None

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FINISHED")
            self.run_id = None
