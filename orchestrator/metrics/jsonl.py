"""Metrics log: one JSON object per step, appended and flushed (a crash loses at most the open step)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from orchestrator.metrics.sink import MetricSink, SinkContext

METRICS_FILE = "metrics.jsonl"


class JsonlLogger(MetricSink):
    """Appends `{"step": k, "<phase>/<name>": value, ...}` rows to `path` (a metric sink: `log_row`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> Optional["JsonlLogger"]:
        """`<run.output_dir>/metrics.jsonl`; a fresh run starts an empty log, a resume drops the rows past
        `ctx.start_step` (the steps it redoes)."""
        logger = cls(Path(ctx.out_dir) / METRICS_FILE)
        logger.keep_steps_up_to(ctx.start_step)
        return logger

    def keep_steps_up_to(self, step: int) -> None:
        """Drop rows with a step > `step` (0: start an empty log), e.g. the rows a resume redoes."""
        if not self.path.exists():
            return
        rows = [r for r in read_jsonl(self.path) if r.get("step", 0) <= step] if step > 0 else []  # 0: the eval row too
        with open(self.path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)

    def log_row(self, row: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """All rows of a metrics log."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
