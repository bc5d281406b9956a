"""The metric sinks a run can name in `metrics.sinks`, and `build_sinks`, the one place they are made.

A name here, or a dotted path `pkg.module:Class` (or `pkg.module.Class`) to a `MetricSink` subclass (no file
of ours to edit). A new built-in sink is one file plus one line in `SINKS` (name -> the class's dotted path;
the module is imported only when a run names the sink).
"""
from __future__ import annotations

import importlib

from orchestrator.metrics.sink import MetricSink, MetricSinks, SinkContext

SINKS: dict[str, str | type[MetricSink]] = {
    "console": "orchestrator.metrics.console:ConsoleProgress",  # run.progress: the table and progress bar
    "jsonl": "orchestrator.metrics.jsonl:JsonlLogger",  # <run.output_dir>/metrics.jsonl: the run's record
    "prometheus": "orchestrator.metrics.prometheus:PrometheusExporter",  # /metrics when metrics.prometheus_port > 0
}


def resolve_sink(name: str, key: str = "metrics.sinks") -> type[MetricSink]:
    """The sink class of a registered `name` or a dotted path `pkg.module:Class` / `pkg.module.Class`. Raises
    ValueError naming `key`, the value and the registered names when it cannot be found or is not a MetricSink."""
    target = SINKS.get(name, name)
    if isinstance(target, type):
        return target
    if ":" in target:
        module, _, attr = target.partition(":")
    elif "." in target:
        module, _, attr = target.rpartition(".")
    else:
        raise ValueError(f"{key}: unknown sink {name!r}; registered: {sorted(SINKS)}, or a dotted path "
                         "'pkg.module:Class' to a MetricSink subclass")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{key}: cannot import sink {name!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, MetricSink)):
        raise ValueError(f"{key}: {name!r} is not a MetricSink subclass (orchestrator/metrics/sink.py)")
    return cls


def build_sinks(cfg, ctx: SinkContext) -> MetricSinks:
    """Every sink of `metrics.sinks` that its config turns on, in the listed order. When one cannot be made,
    the ones already made are closed (a serving Prometheus exporter stops) and the error is raised."""
    made: list[MetricSink] = []
    try:
        for name in cfg.metrics.sinks:
            sink = resolve_sink(name).from_config(cfg, ctx)
            if sink is not None:
                made.append(sink)
    except BaseException:
        MetricSinks(made).close()
        raise
    return MetricSinks(made)
