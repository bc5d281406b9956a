"""Console progress: a progress bar over steps and a per-step table row (rich)."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from orchestrator.metrics.sink import MetricSink, SinkContext

COLUMNS = [  # (header, metric key or keys (the first present is shown), format)
    ("step", "step", "{:d}"),
    ("reward", "reward/mean", "{:.3f}"),
    ("acc", "reward/accuracy_mean", "{:.3f}"),
    ("KL ref", "actor/kl", "{:.4f}"),  # policy vs reference (when algo.kl_coef > 0)
    ("KL roll", "actor/rollout_kl_k1", "{:+.4f}"),  # rollout engine vs trainer, k1 estimate
    ("clip", "actor/clip_frac", "{:.3f}"),
    # policy minus sampling version: rollout.mode one_step_off (its one batch), stream (the batch's oldest sample)
    ("stale", ("async/staleness", "async/staleness_max"), "{:d}"),
    ("resp len", "rollout/response_len_mean", "{:.1f}"),
    ("rw err", "reward/errors", "{:.0f}"),  # reward calls that raised (0 each) ...
    ("rw t/o", "reward/timeouts", "{:.0f}"),  # ... or timed out
    ("gen s", "timing/generate_s", "{:.1f}"),
    ("reward s", "timing/reward_s", "{:.1f}"),
    ("ref s", "timing/reference_s", "{:.1f}"),
    ("train s", "timing/train_s", "{:.1f}"),
    ("sync s", "timing/weight_sync_s", "{:.1f}"),
    ("step s", "timing/step_s", "{:.1f}"),
    ("eval p@1", "eval/pass_at_1", "{:.3f}"),  # held-out eval (eval.every_steps; step 0: before training)
    ("eval s", "timing/eval_s", "{:.1f}"),
]


class ConsoleProgress(MetricSink):
    """Prints a header once, one table row per step, and keeps a progress bar at the bottom (a metric sink;
    `run.progress=false` keeps only the bar's bookkeeping, printing nothing)."""

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> Optional["ConsoleProgress"]:
        return cls(ctx.total_steps, ctx.start_step, enabled=cfg.run.progress)

    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.console = Console(stderr=False, highlight=False)
        if not self.console.is_terminal:  # logs and `ray job submit`: one unwrapped line per step
            self.console = Console(stderr=False, highlight=False, width=200)
        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=True,
                                 disable=not enabled)
        self.task = self.progress.add_task("steps", total=total_steps, completed=start_step)
        self._header = False

    def __enter__(self) -> "ConsoleProgress":
        self.progress.start()
        return self

    def close(self) -> None:
        self.progress.stop()

    @staticmethod
    def format_row(row: dict) -> str:
        cells = []
        for header, keys, fmt in COLUMNS:
            v = next((row[k] for k in ((keys,) if isinstance(keys, str) else keys) if row.get(k) is not None), None)
            text = "-" if v is None else fmt.format(int(v) if fmt == "{:d}" else float(v))
            cells.append(text.rjust(max(len(header), 7)))
        return " ".join(cells)

    def log_row(self, row: dict) -> None:
        if self.enabled:
            if not self._header:
                self.console.print(" ".join(h.rjust(max(len(h), 7)) for h, _, _ in COLUMNS), style="bold")
                self._header = True
            self.console.print(self.format_row(row))
        if row.get("step", 1) > 0:  # step 0: the eval of the starting weights, not a step
            self.progress.advance(self.task)
