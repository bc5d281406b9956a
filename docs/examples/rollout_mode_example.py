"""Worked example: a rollout mode of one's own, in one file, with no file of ours changed.

`overfit_one_batch`: every step trains on the same prompts, the ones the first step drew (new samples each step:
the group ids, and so the sampling seeds, are the step's). It is the classic check of a training loop before a long
run: if the reward on a fixed batch does not climb, the loss, the optimizer, the weight sync or the reward is wrong,
and no amount of data will fix it. It keeps the contract of `rollout.mode=sync` (its `kind`): each batch is generated
by the weights it trains, nothing is pending at a checkpoint, any placement runs it. A resume is exact: the prompt
loader never moves past the first batch, so the checkpoint's loader draws that batch again.

Use it: `rollout.mode=docs.examples.rollout_mode_example` (a dotted module path: orchestrator/rollout/modes.py imports
the module and reads its `MODE`). The pipeline is the synchronous one (orchestrator/rollout/async_source.py
`SyncRollouts`) with its launch changed: it draws the step's prompts, then puts the loader back. Rounds of
algo.dynamic_sampling (`more`) draw the same prompts again under the round's group ids. How the seam works:
docs/extending.md ("A rollout mode"); tests/unit/test_extending_rollout_mode.py runs it over a simulated source and
tests/integration/test_dynamic_sampling_run.py trains a run with it on Ray.
"""
from __future__ import annotations

from orchestrator.rollout.async_source import SyncRollouts
from orchestrator.rollout.modes import SYNC, RolloutMode


class OverfitOneBatch(SyncRollouts):
    """SyncRollouts whose every draw leaves the prompt loader where it was (see the module docstring)."""

    def launch(self, step: int) -> None:
        state = self.loader.state_dict()
        super().launch(step)  # samples the step's prompts (moving the loader) and launches them
        self.loader.load_state_dict(state)

    def more(self, step: int, round_: int, version: int, row: dict, groups: int) -> list:
        state = self.loader.state_dict()
        try:
            return super().more(step, round_, version, row, groups)
        finally:
            self.loader.load_state_dict(state)


def build(source, sample, loader, cfg, start_step=0, score_group=None, on_poll=None) -> OverfitOneBatch:
    """The pipeline factory the registry calls (orchestrator/rollout/pipeline.py `rollout_pipeline`)."""
    return OverfitOneBatch(source, sample, loader, cfg, start_step)


MODE = RolloutMode(name="overfit_one_batch", builder=f"{__name__}:build", kind=SYNC)
