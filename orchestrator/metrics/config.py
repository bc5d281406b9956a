"""The `metrics` section of the run config: Prometheus, the metric sinks, completion samples, redaction and the
experiment trackers' own sections (`metrics.tensorboard`, `metrics.wandb`, `metrics.mlflow`);
`check_metrics_section` resolves every sink and tracker now.

Each tracker named in `metrics.trackers` reads its section (orchestrator/metrics/trackers/, docs/trackers.md);
a section of a tracker not named is ignored. Paths left "" default to a folder in `run.output_dir`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.fields import choice, number


@dataclass
class TensorBoardConfig:
    # event files' folder; "" = <run.output_dir>/tensorboard (`tensorboard --logdir <it>`)
    log_dir: str = ""


@dataclass
class WandbConfig:
    project: str = "rl-orchestrator"
    entity: str = ""  # "" = the account's default entity
    name: str = ""  # the run's display name; "" = run.name
    tags: list = field(default_factory=list)
    # offline: files only (no network; `wandb sync <dir>` uploads them later) | online: streams to the server
    mode: str = choice("offline", ("offline", "online"))
    # the folder W&B writes its run folder `wandb/` into; "" = <run.output_dir>
    dir: str = ""


@dataclass
class MlflowConfig:
    # "" = a local folder store <run.output_dir>/mlruns; or a server "http://host:5000", "sqlite:///path.db"
    tracking_uri: str = ""
    experiment: str = "rl-orchestrator"
    run_name: str = ""  # "" = run.name


@dataclass
class MetricsConfig:
    # Prometheus /metrics served by the controller; 0 = off. Bound to `host` (loopback unless set).
    prometheus_port: int = number(0, ge=0, le=65535)
    prometheus_host: str = "127.0.0.1"
    # A local Ray only (no run.ray_address): the port of the node's Ray metrics agent, which serves Ray's and
    # vLLM's metrics (ray_*, ray_vllm_*) to Prometheus; 0 = a port Ray picks. A cluster sets its own with
    # `ray start --metrics-export-port`.
    ray_export_port: int = number(0, ge=0, le=65535)
    # Where each step's metrics go, in order (orchestrator/metrics/registry.py): registered names
    # (console, jsonl, prometheus) or dotted paths "pkg.module:Class" to a MetricSink subclass. "jsonl" writes
    # <run.output_dir>/metrics.jsonl, which `rl-orch size`, placement.auto and the plot read: keep it.
    sinks: list = field(default_factory=lambda: ["console", "jsonl", "prometheus"])
    # Experiment trackers every row also goes to (docs/trackers.md): any of tensorboard, wandb, mlflow
    trackers: list = field(default_factory=list)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    # Config keys (dotted paths or sections) never logged as hyper-parameters; load_config adds every key set
    # from the environment (${oc.env:NAME}); keys named like key/token/secret/password are always left out
    redact: list = field(default_factory=list)
    # Completion samples: every samples_every steps, samples_n of the step's samples go to
    # <run.output_dir>/samples.jsonl and every sink (tracker tables)
    samples_every: int = number(0, ge=0, note="(0 = off)")
    samples_n: int = number(4, gt=0)


def check_metrics_section(cfg) -> None:
    """metrics.sinks: each a registered sink or an importable MetricSink class, none twice, jsonl present (the run's
    record); metrics.trackers: registered names, none twice. Raises ValueError naming the key;
    orchestrator/config/load.py `validate` calls it (as ConfigError)."""
    from orchestrator.metrics.registry import resolve_sink

    sinks = list(cfg.metrics.sinks)
    repeated = sorted({str(s) for s in sinks if sinks.count(s) > 1})
    if repeated:
        raise ValueError(f"metrics.sinks={sinks}: {repeated} listed more than once (every row would go there twice)")
    for name in sinks:
        resolve_sink(str(name))
    if "jsonl" not in sinks:
        raise ValueError(f"metrics.sinks={sinks}: 'jsonl' is required (metrics.jsonl is the run's record: the plot, "
                         "placement.auto and rl-orch size read it)")
    _check_trackers(list(cfg.metrics.trackers))


def _check_trackers(trackers: list) -> None:
    """metrics.trackers: registered tracker names (orchestrator/metrics/registry.py TRACKERS), each at most once."""
    from orchestrator.metrics.registry import TRACKERS

    unknown = [t for t in trackers if t not in TRACKERS]
    if unknown:
        raise ValueError(f"metrics.trackers={trackers}: unknown tracker(s) {unknown}; choose from {sorted(TRACKERS)}")
    if len(set(trackers)) < len(trackers):
        raise ValueError(f"metrics.trackers={trackers}: a tracker is listed more than once")
