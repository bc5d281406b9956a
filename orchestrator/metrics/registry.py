"""The metric sinks a run can name in `metrics.sinks`, and `build_sinks`, the one place they are made.

A name here, or a dotted path `pkg.module:Class` (or `pkg.module.Class`) to a `MetricSink` subclass (no file
of ours to edit). A new built-in sink is one file plus one line in `SINKS` (name -> the class's dotted path;
the module is imported only when a run names the sink).
"""
from __future__ import annotations


from orchestrator.metrics.sink import MetricSink, MetricSinks, SinkContext
from orchestrator.utils.user_code import import_user_module, split_dotted

SINKS: dict[str, str | type[MetricSink]] = {
    "console": "orchestrator.metrics.console:ConsoleProgress",  # run.progress: the table and progress bar
    "jsonl": "orchestrator.metrics.jsonl:JsonlLogger",  # <run.output_dir>/metrics.jsonl: the run's record
    "prometheus": "orchestrator.metrics.prometheus:PrometheusExporter",  # /metrics when metrics.prometheus_port > 0
}

# `metrics.trackers`: experiment trackers (docs/trackers.md), each wrapped in FaultTolerantSink (a failure is one
# warning and the tracker is off; the run goes on). Imported only when named.
TRACKERS: dict[str, str] = {
    "tensorboard": "orchestrator.metrics.trackers.tensorboard_sink:TensorBoardSink",
    "wandb": "orchestrator.metrics.trackers.wandb_sink:WandbSink",
    "mlflow": "orchestrator.metrics.trackers.mlflow_sink:MlflowSink",
}


def resolve_sink(name: str, key: str = "metrics.sinks") -> type[MetricSink]:
    """The sink class of a registered `name` or a dotted path `pkg.module:Class` / `pkg.module.Class`. Raises
    ValueError naming `key`, the value and the registered names when it cannot be found or is not a MetricSink."""
    target = SINKS.get(name, name)
    if isinstance(target, type):
        return target
    parts = split_dotted(target)
    if parts is None:
        raise ValueError(f"{key}: unknown sink {name!r}; registered: {sorted(SINKS)}, or a dotted path "
                         "'pkg.module:Class' to a MetricSink subclass")
    module, attr = parts
    cls = getattr(import_user_module(module, f"{key}: sink {name!r}"), attr, None)
    if cls is None:
        raise ValueError(f"{key}: sink {name!r}: module {module!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, MetricSink)):
        raise ValueError(f"{key}: {name!r} is not a MetricSink subclass (orchestrator/metrics/sink.py)")
    return cls


def build_sinks(cfg, ctx: SinkContext) -> MetricSinks:
    """Every sink of `metrics.sinks` that its config turns on, in the listed order, then samples.jsonl
    (`metrics.samples_every` > 0) and the `metrics.trackers` (each fault-tolerant: a tracker that cannot start
    is one warning, never an error). When a sink cannot be made, the ones already made are closed (a serving
    Prometheus exporter stops) and the error is raised."""
    from orchestrator.metrics.samples_file import SamplesFile
    from orchestrator.metrics.trackers import FaultTolerantSink

    made: list[MetricSink] = []
    try:
        for name in cfg.metrics.sinks:
            made.append(resolve_sink(name).from_config(cfg, ctx))
        made.append(SamplesFile.from_config(cfg, ctx))
        for name in cfg.metrics.trackers:
            made.append(FaultTolerantSink.build(name, LazyTracker(name), cfg, ctx))
    except BaseException:
        MetricSinks([s for s in made if s is not None]).close()
        raise
    return MetricSinks([s for s in made if s is not None])


class LazyTracker:
    """`from_config` of the tracker registered as `name` in TRACKERS, its module imported only then (so that
    a missing library is the tracker's one warning, FaultTolerantSink)."""

    def __init__(self, name: str):
        self.name = name

    def from_config(self, cfg, ctx: SinkContext) -> MetricSink:
        return resolve_sink(TRACKERS[self.name], key="metrics.trackers").from_config(cfg, ctx)
