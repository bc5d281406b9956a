"""The experiment-tracker sections of the run config: `metrics.tensorboard`, `metrics.wandb`, `metrics.mlflow`.

Each tracker named in `metrics.trackers` reads its section (orchestrator/metrics/trackers/, docs/trackers.md);
a section of a tracker not named is ignored. Paths left "" default to a folder in `run.output_dir`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.fields import choice


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
