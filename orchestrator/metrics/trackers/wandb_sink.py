"""Weights & Biases (`metrics.trackers: [wandb]`, section `metrics.wandb`): offline by default (files under
<metrics.wandb.dir or run.output_dir>/wandb/, uploaded later with `wandb sync`), online with mode=online
(credentials from `wandb login` / WANDB_API_KEY: never from the run config). docs/trackers.md.

Every numeric row value is logged under its row name at the row's step (W&B's `_step`); the config is the run's
W&B config (secrets left out); completion samples are a `samples` table at their step. The run id is kept in
<run.output_dir>/trackers.json: a resume continues that run (resume="allow") and skips the steps it already
holds (common.StepGate), so no step appears twice.
"""
from __future__ import annotations

import uuid

from orchestrator.metrics.samples import table_rows
from orchestrator.metrics.sink import MetricSink, SinkContext
from orchestrator.metrics.trackers.common import StepGate, TrackerState, numeric_items, out_path, run_hparams


class WandbSink(MetricSink):
    """One W&B run for the whole training run (continued on resume)."""

    def __init__(self, cfg, ctx: SinkContext):
        import wandb

        w = cfg.metrics.wandb
        self.state = TrackerState(ctx.out_dir, "wandb")
        run_id, last_step = self.state.resume(ctx.start_step)
        folder = out_path(w.dir, ctx.out_dir, "")
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=w.project, entity=w.entity or None, name=w.name or ctx.run_name,
                              tags=list(w.tags) or None, mode=w.mode, dir=str(folder), id=run_id or uuid.uuid4().hex[:12],
                              resume="allow", config=run_hparams(cfg), reinit="create_new",
                              settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
        self.state.put(run_id=self.run.id, last_step=last_step, dir=str(self.run.dir))
        self.gate = StepGate(self.state, last_step)
        self.wandb = wandb

    @classmethod
    def from_config(cls, cfg, ctx: SinkContext) -> "WandbSink":
        return cls(cfg, ctx)

    def log_row(self, row: dict) -> None:
        step = int(row["step"])
        if self.gate.admit(step):
            self.run.log(numeric_items(row), step=step)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        if self.gate.holds(step):  # a step the resume redoes: the run already holds its samples
            return
        columns, rows = table_rows(samples)
        self.run.log({"samples": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def on_error(self, exc: BaseException) -> None:
        self.finish(exit_code=1)

    def close(self) -> None:
        self.finish(exit_code=0)

    def finish(self, exit_code: int) -> None:
        """End the W&B run once (a failed run: exit code 1; a resume continues it all the same)."""
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=exit_code)
