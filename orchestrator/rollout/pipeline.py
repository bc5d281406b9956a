"""The rollout-pipeline seam: when the batches a step trains are generated (`rollout.mode`), behind one interface.

    pipeline = rollout_pipeline(source, sample, loader, cfg, start_step, score_group, on_poll)
    pipeline.launch(step)                        # start what this step's schedule starts
    trajs = pipeline.take(step, version, row)    # this step's batch: prompts_per_step groups, `rollout/*` into row
    scored = pipeline.scores(row)                # its rewards / reference logprobs scored per group, or None
    trajs = pipeline.more(step, r, version, row, groups)   # algo.dynamic_sampling: round r, >= `groups` more groups
    ... reward, reference, advantages, train: job.wait(train ref, pump=pipeline.pump) ...
    pipeline.finish_in_flight(row)               # nothing may generate across the weight sync (but the stream's)
    ... sync_weights(step) ...; pipeline.synced(step)

Three implementations, one per built-in mode (the registry: orchestrator/rollout/modes.py), built by
`rollout_pipeline` (the one factory):

| rollout.mode | class | module | batch of step k generated |
|---|---|---|---|
| `sync` | `SyncRollouts` | orchestrator/rollout/async_source.py | at step k, on weights k - 1 (depth 0) |
| `one_step_off` | `AsyncRollouts` | orchestrator/rollout/async_source.py | during step k - 1, on weights k - 2 (depth 1) |
| `stream` | `StreamRollouts` | orchestrator/rollout/stream_source.py | continuously; groups trained in completion order |

All three run over one rollout source (orchestrator/rollout/source.py: single-turn or multi-turn, the lost-worker
reissue written once there; the stream drives the source's workers through their streaming calls). The controller
(orchestrator/controller.py) has one step over this interface; the group filters of the step (DAPO's dynamic
sampling: orchestrator/rollout/dynamic_sampling.py; the overlong filter: orchestrator/reward/overlong.py) work on
what `take` and `more` return, so they hold in every mode, and the staleness bound (`algo.max_staleness`: the
largest staleness a trained token may have) is each pipeline's admission rule. How to add a fourth mode:
docs/extending.md ("A rollout mode"; worked example docs/examples/rollout_mode_example.py).
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol

from orchestrator.rollout.async_source import AsyncRollouts, SyncRollouts
from orchestrator.rollout.group_scores import BatchScores, Issue
from orchestrator.rollout.modes import get
from orchestrator.rollout.source import RolloutSource
from orchestrator.rollout.stream_source import StreamRollouts
from orchestrator.rollout.types import Trajectory


class RolloutPipeline(Protocol):
    """When a step's batch is generated (see the module docstring). Versions count policy updates (the trainer at
    step k trains version k - 1; weight sync k brings the engines to version k)."""

    pump: Optional[Callable[[], None]]  # called while the trainer trains (the stream drains its engines), or None

    def launch(self, step: int) -> None:
        """Start the generations this step's schedule starts (sync: this step's batch; one-step-off: the next one)."""

    def take(self, step: int, version: int, row: dict) -> list[Trajectory]:
        """Step `step`'s batch (rollout.prompts_per_step groups), waited for; `version`: the policy version trained.
        Writes `rollout/*` (and the mode's `async/*`) into `row`. Raises WeightMismatchError for a sample stamped
        with another version than its engines held."""

    def more(self, step: int, round_: int, version: int, row: dict, groups: int) -> list[Trajectory]:
        """At least `groups` more groups for step `step` (round `round_` >= 1 of algo.dynamic_sampling), waited
        for; of the groups taken at a step, the step trains exactly rollout.prompts_per_step."""

    def scores(self, row: dict) -> Optional[BatchScores]:
        """The rewards and reference logprobs of the groups taken last, scored per group (stream), or None."""

    def finish_in_flight(self, row: dict) -> None:
        """Before the weight sync: wait for what generates on the old weights (the stream: nothing)."""

    def synced(self, version: int) -> None:
        """Weight sync `version` reached every engine."""

    def loader_state(self) -> Optional[dict]:
        """The prompt loader's state a checkpoint keeps (None: the loader's own)."""

    def state_dict(self) -> Optional[dict]:
        """The generated, untrained groups a checkpoint keeps (orchestrator/rollout/resume_mode.py), or None."""

    def load_state_dict(self, state: dict) -> None:
        """A resume: a checkpoint's untrained groups back in the pipeline (before the first `launch`)."""

    def discard(self, engine_version: Optional[int] = None) -> list:
        """Forget everything in flight (the engines are replaced); returns what was dropped."""


def rollout_pipeline(source: RolloutSource, sample: Callable[..., list], loader, cfg, start_step: int = 0,
                     score_group: Optional[Issue] = None,
                     on_poll: Optional[Callable[[], None]] = None) -> RolloutPipeline:
    """The pipeline of `cfg.rollout.mode` (the registry: orchestrator/rollout/modes.py) over `source`.
    sample(step, round_=0) -> that step's PromptRequests (drawn from `loader`); score_group: the stream's per-group
    scoring (each complete group's reward and reference calls), on_poll: called before every drain of the stream's
    engines (weight_sync.overlap). Raises ValueError for a mode the registry does not know."""
    return get(cfg.rollout.mode).build()(source, sample, loader, cfg, start_step, score_group, on_poll)


def build_sync(source, sample, loader, cfg, start_step=0, score_group=None, on_poll=None) -> SyncRollouts:
    """`rollout.mode=sync`: every batch generated by the weights it trains (depth 0)."""
    return SyncRollouts(source, sample, loader, cfg, start_step)


def build_one_step_off(source, sample, loader, cfg, start_step=0, score_group=None, on_poll=None) -> AsyncRollouts:
    """`rollout.mode=one_step_off`: step k + 1's batch generates while step k trains."""
    return AsyncRollouts(source, sample, loader, cfg, start_step)


def build_stream(source, sample, loader, cfg, start_step=0, score_group=None, on_poll=None) -> StreamRollouts:
    """`rollout.mode=stream`: the engines generate throughout (partial rollouts), groups scored as they complete."""
    return StreamRollouts(source.workers, source.wait, sample, loader, cfg, start_step, source.recover,
                          env_cfg=getattr(source, "env_cfg", None), score_group=score_group, on_poll=on_poll)
