"""Metrics: the MetricSink seam (console, JSONL log, Prometheus; `build_sinks` from config) and the PNG plot."""
from orchestrator.metrics.console import ConsoleProgress
from orchestrator.metrics.jsonl import METRICS_FILE, JsonlLogger, read_jsonl
from orchestrator.metrics.plot import plot_run
from orchestrator.metrics.sink import MetricSink, MetricSinks, SinkContext

__all__ = ["METRICS_FILE", "ConsoleProgress", "JsonlLogger", "MetricSink", "MetricSinks", "SinkContext", "plot_run",
           "read_jsonl"]
