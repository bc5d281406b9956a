"""What the trackers share: the numbers of a row, the run config as hyper-parameters, and the tracker state
file that lets a resumed run continue the same tracker run.

<run.output_dir>/trackers.json: {"wandb": {"run_id": "...", "last_step": 12}, "mlflow": {...}}. A resume
(`SinkContext.start_step` > 0) reuses the run id and skips the rows it already holds (step <= last_step: the
steps a resume redoes, already in the tracker run); a fresh run (start_step 0) starts a new tracker run.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from orchestrator.metrics.hparams import flat_hparams

STATE_FILE = "trackers.json"


def numeric_items(row: dict) -> dict[str, float]:
    """{name: value} of the row's finite numbers (bools as 0/1), `step` excluded; None, NaN, inf and strings
    are left out."""
    out = {}
    for k, v in row.items():
        if k == "step" or v is None or isinstance(v, str) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


def run_hparams(cfg) -> dict[str, Any]:
    """The resolved run config flattened to {dotted key: scalar}, secrets replaced (orchestrator/metrics/hparams.py)."""
    plain = OmegaConf.to_container(cfg if OmegaConf.is_config(cfg) else OmegaConf.structured(cfg), resolve=True)
    return flat_hparams(plain, list(cfg.metrics.redact))


def out_path(setting: str, out_dir: Path, default: str) -> Path:
    """`setting` as a path, or `out_dir / default` when it is ""."""
    return Path(setting) if setting else Path(out_dir) / default


class TrackerState:
    """The `trackers.json` entry of one tracker (`name`) in `out_dir`; written atomically on every change."""

    def __init__(self, out_dir: Path, name: str):
        self.path, self.name = Path(out_dir) / STATE_FILE, name

    def read_all(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def get(self) -> dict:
        return dict(self.read_all().get(self.name, {}))

    def put(self, **fields) -> None:
        state = self.read_all()
        state[self.name] = {**state.get(self.name, {}), **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def resume(self, start_step: int) -> tuple[Optional[str], int]:
        """(run id to continue or None, last step the tracker run holds): the stored ones on a resume
        (start_step > 0), (None, 0) for a fresh run."""
        entry = self.get()
        if start_step > 0 and entry.get("run_id"):
            return str(entry["run_id"]), int(entry.get("last_step", 0))
        return None, 0


class StepGate:
    """Which rows a resumed tracker run still needs: rows past `held` (the last step the run held when this
    sink started; those it holds are skipped, so no step appears twice). Records every step it lets through."""

    def __init__(self, state: TrackerState, held: int):
        self.state, self.held = state, held

    def holds(self, step: int) -> bool:
        """Whether the tracker run already had `step` when this sink started (a step the resume redoes)."""
        return step <= self.held

    def admit(self, step: int) -> bool:
        """Whether to log the row of `step` (then recorded as the run's last step)."""
        if self.holds(step):
            return False
        self.state.put(last_step=step)
        return True
