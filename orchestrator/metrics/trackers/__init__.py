"""Experiment trackers as metric sinks (`metrics.trackers`, docs/trackers.md): TensorBoard, Weights & Biases,
MLflow. Each is a `MetricSink` (orchestrator/metrics/sink.py) in its own module, imported only when a run names
it (orchestrator/metrics/registry.py: TRACKERS), and always wrapped in `FaultTolerantSink` (guarded.py): a
tracker that fails prints one warning and is disabled; the run goes on.

Common rules (common.py): every numeric value of a row goes to every tracker under its row name at the row's
`step` (None, strings and bools are skipped); the run config is logged once as hyper-parameters with secrets
left out (orchestrator/metrics/hparams.py); a resume (`SinkContext.start_step` > 0) continues the same tracker
run (ids in <run.output_dir>/trackers.json) and never shows a step twice.
"""
from orchestrator.metrics.trackers.guarded import FaultTolerantSink

__all__ = ["FaultTolerantSink"]
