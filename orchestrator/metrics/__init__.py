"""Metrics: JSONL log per step, console progress and table, PNG plot."""
from orchestrator.metrics.console import ConsoleProgress
from orchestrator.metrics.jsonl import JsonlLogger, read_jsonl
from orchestrator.metrics.plot import plot_run

__all__ = ["ConsoleProgress", "JsonlLogger", "plot_run", "read_jsonl"]
