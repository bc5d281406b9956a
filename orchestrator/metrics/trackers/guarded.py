"""`FaultTolerantSink`: a tracker that fails (import error, bad key, no network, full disk) prints ONE warning
naming the tracker and the cause, and is disabled for the rest of the run; training never stops for it.

    sink = FaultTolerantSink.build("wandb", WandbSink, cfg, ctx)   # None when its config turns it off
    sink.log_row(row)    # never raises (Exception); after a failure: does nothing
"""
from __future__ import annotations

from typing import Callable, Optional

from orchestrator.metrics.sink import MetricSink, SinkContext


def tracker_warning(name: str, when: str, exc: BaseException) -> str:
    """The one line printed when tracker `name` fails `when` (e.g. "starting", "logging step 3")."""
    cause = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    return (f"WARNING: tracker {name!r} failed {when} ({cause}); it is disabled for the rest of the run, "
            f"training goes on (metrics.trackers, docs/trackers.md)")


class FaultTolerantSink(MetricSink):
    """Wraps tracker `inner` (named `name`): any Exception from a hook prints `tracker_warning` once and
    disables the tracker (later calls do nothing). KeyboardInterrupt / SystemExit pass through."""

    def __init__(self, name: str, inner: Optional[MetricSink], printer: Callable[[str], None] = print):
        self.name, self.inner, self.printer = name, inner, printer
        self.failed: Optional[BaseException] = None

    @classmethod
    def build(cls, name: str, kind, cfg, ctx: SinkContext,
              printer: Callable[[str], None] = print) -> Optional["FaultTolerantSink"]:
        """`kind.from_config(cfg, ctx)` wrapped; a failure to start (the library missing, a bad key) is the
        one warning and a disabled sink; None when the tracker's config turns it off."""
        sink = cls(name, None, printer)
        inner = sink.guard("starting", kind.from_config, cfg, ctx)
        if inner is None and sink.failed is None:
            return None
        sink.inner = inner
        return sink

    @property
    def active(self) -> bool:
        return self.failed is None and self.inner is not None

    def guard(self, when: str, fn, *args):
        """fn(*args), or None after printing the warning and disabling the tracker on an Exception."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - a tracker never stops the run
            self.failed = e
            self.printer(tracker_warning(self.name, when, e))
            self.release()
            return None

    def release(self) -> None:
        """Best-effort close of a failed tracker (its own errors are ignored: it was already reported)."""
        inner, self.inner = self.inner, None
        if inner is not None:
            try:
                inner.close()
            except Exception:  # noqa: BLE001 - already disabled and reported
                pass

    def log_row(self, row: dict) -> None:
        if self.active:
            self.guard(f"logging step {row.get('step')}", self.inner.log_row, row)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        if self.active:
            self.guard(f"logging the samples of step {step}", self.inner.log_samples, step, samples)

    def on_error(self, exc: BaseException) -> None:
        if self.active:
            self.guard("recording the run's error", self.inner.on_error, exc)

    def close(self) -> None:
        if self.active:
            inner, self.inner = self.inner, None
            try:
                inner.close()
            except Exception as e:  # noqa: BLE001 - a tracker never stops the run
                self.failed = e
                self.printer(tracker_warning(self.name, "closing", e))
