"""The metric sinks a run can name in `metrics.sinks`, and `build_sinks`, the one place they are made.

A name here, or a dotted path `pkg.module:Class` to a `MetricSink` subclass (no file of ours to edit). A
new built-in sink is one file plus one line in `SINKS`.
"""
from __future__ import annotations

import importlib

from orchestrator.metrics.console import ConsoleProgress
from orchestrator.metrics.jsonl import JsonlLogger
from orchestrator.metrics.prometheus import PrometheusExporter
from orchestrator.metrics.sink import MetricSink, MetricSinks, SinkContext

SINKS: dict[str, type[MetricSink]] = {
    "console": ConsoleProgress,  # run.progress: the table and progress bar
    "jsonl": JsonlLogger,  # <run.output_dir>/metrics.jsonl: the run's record (rl-orch size, the plot read it)
    "prometheus": PrometheusExporter,  # /metrics when metrics.prometheus_port > 0
}


def resolve_sink(name: str, key: str = "metrics.sinks") -> type[MetricSink]:
    """The sink class of a registered `name` or a dotted path `pkg.module:Class`. Raises ValueError naming
    `key`, the value and the registered names when it cannot be found or is not a MetricSink."""
    if name in SINKS:
        return SINKS[name]
    if ":" not in name:
        raise ValueError(f"{key}: unknown sink {name!r}; registered: {sorted(SINKS)}, or a dotted path "
                         "'pkg.module:Class' to a MetricSink subclass")
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{key}: cannot import sink {name!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, MetricSink)):
        raise ValueError(f"{key}: {name!r} is not a MetricSink subclass (orchestrator/metrics/sink.py)")
    return cls


def build_sinks(cfg, ctx: SinkContext) -> MetricSinks:
    """Every sink of `metrics.sinks` that its config turns on, in the listed order."""
    made = (resolve_sink(name).from_config(cfg, ctx) for name in cfg.metrics.sinks)
    return MetricSinks([s for s in made if s is not None])
