"""TensorBoard (`metrics.trackers: [tensorboard]`): event files in `metrics.tensorboard.log_dir` (default
<run.output_dir>/tensorboard); `tensorboard --logdir runs/<name>/tensorboard` (docs/trackers.md).

Every numeric row value is a scalar under its row name at the row's step; the config is a text summary
`config` (secrets left out); completion samples are a markdown table `samples` at their step. A resume or a
supervised restart at step k opens the writer with purge_step=k+1: TensorBoard drops every event of the
folder at a step > k written before, so a replayed step never shows twice.
"""
from __future__ import annotations

from typing import Optional

from orchestrator.metrics.samples import markdown_table
from orchestrator.metrics.sink import MetricSink, SinkContext
from orchestrator.metrics.trackers.common import numeric_items, out_path, run_hparams


def config_markdown(hparams: dict) -> str:
    """The hyper-parameters as a two-column markdown table (TensorBoard's text plugin renders it)."""
    lines = ["| key | value |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in sorted(hparams.items())]
    return "\n".join(lines)


class TensorBoardSink(MetricSink):
    """Writes a run's rows and samples as TensorBoard events (torch.utils.tensorboard.SummaryWriter)."""

    def __init__(self, log_dir, start_step: int = 0, hparams: Optional[dict] = None):
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=start_step + 1)
        if hparams is not None:
            self.writer.add_text("config", config_markdown(hparams), global_step=start_step)
            self.writer.flush()

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> "TensorBoardSink":
        log_dir = out_path(cfg.metrics.tensorboard.log_dir, ctx.out_dir, "tensorboard")
        return cls(log_dir, ctx.start_step, run_hparams(cfg))

    def log_row(self, row: dict) -> None:
        step = int(row["step"])
        for name, value in numeric_items(row).items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()  # a crash loses nothing logged

    def log_samples(self, step: int, samples: list[dict]) -> None:
        self.writer.add_text("samples", markdown_table(samples), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
