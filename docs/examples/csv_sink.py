"""Worked example: a metric sink that writes chosen columns of every step to a CSV file (spreadsheets, pandas).

Use it with no file of ours changed, by dotted path in `metrics.sinks` (keep `jsonl`, the run's record):

    python -m orchestrator configs/grpo_arith_cpu.yaml \
        'metrics.sinks=[console, jsonl, prometheus, "docs.examples.csv_sink:CsvSink"]'

or make it built-in: copy it to orchestrator/metrics/csv.py and add one line to `SINKS` in
orchestrator/metrics/registry.py (`"csv": "orchestrator.metrics.csv:CsvSink",`); then `metrics.sinks=[console, jsonl, csv]`.

The contract (orchestrator/metrics/sink.py): `from_config(cfg, ctx)` builds the sink (or returns None when its
settings turn it off), `log_row(row)` gets each finished step's `{"step": k, "<phase>/<name>": value}` (None for
a value that was not finite), `log_samples` completion samples (ignored here), `on_error(exc)` the exception
that stops the run, `close()` flushes. A resumed run passes `ctx.start_step`: rows past it are dropped, as the
JSONL log drops them, so the file never shows a replayed step twice.

Try it: python -c "from docs.examples.csv_sink import CsvSink; s = CsvSink('/tmp/m.csv'); s.log_row({'step': 1, 'reward/mean': 0.5}); s.close(); print(open('/tmp/m.csv').read())"
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

from orchestrator.metrics.sink import MetricSink, SinkContext

COLUMNS = ("step", "reward/mean", "actor/loss", "actor/kl", "rollout/response_len_mean", "timing/step_s")


class CsvSink(MetricSink):
    """Appends one line per step with `columns` (a missing key or a None value: an empty cell) to `path`."""

    def __init__(self, path: str | Path, columns: tuple[str, ...] = COLUMNS, start_step: int = 0):
        self.path, self.columns = Path(path), tuple(columns)
        kept = self._rows_up_to(start_step)
        self._file = open(self.path, "w", newline="", encoding="utf-8")
        self._writer = csv.writer(self._file)
        self._writer.writerow(self.columns)
        self._writer.writerows(kept)
        self._file.flush()

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> Optional["CsvSink"]:
        return cls(Path(ctx.out_dir) / "metrics.csv", start_step=ctx.start_step)

    def _rows_up_to(self, step: int) -> list[list[str]]:
        """The lines of an earlier run of this output folder with a step <= `step` (a resume keeps them)."""
        if step <= 0 or not self.path.exists():
            return []
        with open(self.path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        if not rows or tuple(rows[0]) != self.columns:
            return []
        return [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= step]

    def log_row(self, row: dict) -> None:
        self._writer.writerow(["" if row.get(c) is None else row[c] for c in self.columns])
        self._file.flush()  # a crash loses at most the open step, as with metrics.jsonl

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
