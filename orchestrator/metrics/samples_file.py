"""<run.output_dir>/samples.jsonl: the completion samples (orchestrator/metrics/samples.py), one JSON record per
line, appended when a step logs them (`metrics.samples_every` > 0; added by `build_sinks`). A resume drops the
records past `SinkContext.start_step` (the steps it redoes), a fresh run starts an empty file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchestrator.metrics.sink import MetricSink, SinkContext

SAMPLES_FILE = "samples.jsonl"


class SamplesFile(MetricSink):
    """Appends every record given to `log_samples` to `path`; rows are ignored."""

    def __init__(self, path: str | Path, start_step: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= start_step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> Optional["SamplesFile"]:
        """None when `metrics.samples_every` is 0."""
        if cfg.metrics.samples_every <= 0:
            return None
        return cls(Path(ctx.out_dir) / SAMPLES_FILE, ctx.start_step)

    def log_row(self, row: dict) -> None:
        """Rows go to metrics.jsonl, not here."""

    def log_samples(self, step: int, samples: list[dict]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(s, sort_keys=True) + "\n" for s in samples)
