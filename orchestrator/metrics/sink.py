"""The metric-sink seam: every place a run's metrics go (console, JSONL log, Prometheus, trackers) is one
`MetricSink`, built from config in one place (`build_sinks`) and fed by the controller through `MetricSinks`.

    with build_sinks(cfg, SinkContext(out_dir, run_name, total_steps, start_step)) as sinks:
        for step ...:
            sinks.log_row(row)            # every sink, in order
        # leaving the block: on_error(exc) on a failure, then close() on every sink

A new sink is one file with a `MetricSink` subclass and a `from_config(cfg, ctx)` classmethod, plus one line
in `orchestrator/metrics/registry.py`; or, with no file of ours, a dotted path `pkg.module:Class` in
`metrics.sinks` (docs/extending.md, docs/examples/csv_sink.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class SinkContext:
    """What a sink may need besides the config: the run's output folder, its name, and the step range
    (`start_step` > 0 on resume: a sink drops or overwrites what it holds past that step)."""

    out_dir: Path
    run_name: str
    total_steps: int
    start_step: int = 0


class MetricSink:
    """One destination of the run's metrics. `log_row` is required; the other hooks default to nothing.

    A row is `{"step": int, "<phase>/<name>": float | int | str | None, ...}` (units in the names, e.g.
    `timing/train_s`); `None` stands for a value that was not finite.
    """

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> Optional["MetricSink"]:
        """The sink for this run, or None when its config turns it off. Raises ValueError (naming the
        config key) for a bad setting."""
        return cls()

    def log_row(self, row: dict) -> None:
        """One step's metrics, after the step finished."""
        raise NotImplementedError

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """Completion samples of `step`, every `metrics.samples_every` steps, after that step's `log_row`: records
        {"prompt", "completion", "reward", "rewards", "advantage", ...} (orchestrator/metrics/samples.py);
        ignored by default."""

    def on_error(self, exc: BaseException) -> None:
        """The run is stopping with `exc` (called before `close`)."""

    def close(self) -> None:
        """Flush and release (idempotent)."""

    def __enter__(self) -> "MetricSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """On an exception leaving the block: `on_error(exc)`; always `close`; the exception is re-raised."""
        try:
            if isinstance(exc, Exception):  # not KeyboardInterrupt / SystemExit
                self.on_error(exc)
        finally:
            self.close()
        return False


class MetricSinks:
    """The run's sinks as one: each call goes to every sink in order; a context manager that reports an
    exception to every sink (`on_error`) and closes them all, re-raising the exception."""

    def __init__(self, sinks: list[MetricSink]):
        self.sinks = list(sinks)

    def __iter__(self):
        return iter(self.sinks)

    def find(self, kind: type) -> Optional[MetricSink]:
        """The first sink that is an instance of `kind`, or None."""
        return next((s for s in self.sinks if isinstance(s, kind)), None)

    def log_row(self, row: dict) -> None:
        for s in self.sinks:
            s.log_row(row)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        for s in self.sinks:
            s.log_samples(step, samples)

    def close(self) -> None:
        errors = []
        for s in self.sinks:
            try:
                s.close()
            except Exception as e:  # noqa: BLE001 - every sink is closed; the first failure is raised after
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "MetricSinks":
        for s in self.sinks:
            s.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if isinstance(exc, Exception):  # not KeyboardInterrupt / SystemExit
                for s in self.sinks:
                    s.on_error(exc)
        finally:
            self.close()
        return False
