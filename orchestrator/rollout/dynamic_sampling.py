"""DAPO dynamic sampling: a step trains only on groups whose rewards differ (Yu et al. 2025, "DAPO: An Open-Source
LLM Reinforcement Learning System at Scale", section 3.2, the constraint of eq. 11: 0 < |{o_i correct}| < G), in
every rollout mode: a group filter over what the rollout pipeline (orchestrator/rollout/pipeline.py) returns.

A group whose n rewards are all equal has advantage 0 under a group baseline and adds nothing but noise to the
update. With `algo.dynamic_sampling.enabled`, a step takes its batch of `rollout.prompts_per_step` groups from the
pipeline (round 0), scores it, sets the uniform groups aside, and asks the pipeline for more (`more`, rounds 1, 2,
...) until it holds `rollout.prompts_per_step` informative groups (the first ones in the order taken; surplus ones
are dropped) or after `max_rounds` rounds. What a round is depends on the mode: `sync` and `one_step_off` sample a
whole round of rollout.prompts_per_step more prompts and generate it at once (DAPO's over-sampling; one-step-off: on
the engines' current weights, staleness 0), `stream` takes as many more complete groups as are missing from the
stream (already generating: a round costs little; their slots start new groups). Short after max_rounds: the step
trains on its informative groups topped up with uniform ones in the order taken, so the global batch keeps its size
(trainer.mini_batches and trainer.num_workers divide it); a warning is printed the first time. Every prompt drawn
moves the loader, whose state the checkpoint saves, and every round's seeds are a function of (rollout.seed, step,
group id): a resume is exact.

Group ids stay unique over the run: round r of step s gives prompt i the id s * P + i + r * ROUND_STRIDE
(P = rollout.prompts_per_step; round 0 is exactly the id without dynamic sampling; the stream's groups keep the ids
of the batch they were drawn in).

Metrics: rollout/dyn_groups_generated (groups taken), rollout/dyn_groups_kept (informative groups trained),
rollout/dyn_groups_padded (uniform groups trained to fill the batch), rollout/dyn_rounds. The rollout/* and reward/*
metrics of the rounds are merged over every sample taken (`merge_round_rows`); actor/* and rollout/groups_mixed_frac
describe the trained batch. Pure: the controller and the pipeline are passed in (`Host`, `Rounds`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Protocol

# Extra rounds' group ids: round r >= 1 of a step adds r * ROUND_STRIDE to the first round's step * P + i, so
# they never meet a first-round id while steps * rollout.prompts_per_step < ROUND_STRIDE (checked at config load:
# orchestrator/config/sampling.py).
ROUND_STRIDE = 2**40
MAX_ROUNDS = 1000  # ROUND_STRIDE * MAX_ROUNDS < 2**63: every id fits an int64


def round_group_id(step: int, index: int, round_: int, prompts_per_step: int) -> int:
    """The group id of prompt `index` (0 .. P-1) of round `round_` of `step`: step * P + index + round * ROUND_STRIDE."""
    return step * prompts_per_step + index + round_ * ROUND_STRIDE


class Host(Protocol):
    """What the filter calls on the controller (orchestrator/controller.py)."""

    reward_parts: dict  # each reward function's values over the last scored batch (completion samples)

    def score(self, trajs: list, row: dict, result=None) -> list: ...


class Rounds(Protocol):
    """What the filter calls on the rollout pipeline (orchestrator/rollout/pipeline.py `RolloutPipeline`)."""

    def take(self, step: int, version: int, row: dict) -> list: ...
    def more(self, step: int, round_: int, version: int, row: dict, groups: int) -> list: ...
    def scores(self, row: dict): ...


def informative(rewards: list[float]) -> bool:
    """Whether a group's rewards are not all equal (DAPO eq. 11: 0 < correct < G)."""
    return bool(rewards) and max(rewards) > min(rewards)


def split_groups(trajs: list, rewards: list[float]) -> list[tuple[list[int], bool]]:
    """The batch's groups in order of first appearance: ([their indices in the batch], informative)."""
    order: dict[int, list[int]] = {}
    for i, t in enumerate(trajs):
        order.setdefault(t.group_id, []).append(i)
    return [(idx, informative([rewards[i] for i in idx])) for idx in order.values()]


@dataclass
class StepBatch:
    """What a step trains: trajectories [B], rewards [B] and, when scored per group (stream), reference logprobs
    [B][len(response_i)] (None: the step asks the reference for them)."""

    trajs: list
    rewards: list[float]
    reference: Optional[list] = None


@dataclass
class Pool:
    """Groups collected over a step's rounds: (trajectories, rewards, {function: values}, reference or None) each."""

    kept: list = field(default_factory=list)
    uniform: list = field(default_factory=list)
    generated: int = 0

    def add(self, trajs: list, rewards: list[float], parts: dict, reference: Optional[list] = None) -> None:
        parts = {k: v for k, v in parts.items() if len(v) == len(trajs)}  # multi-turn: none (env rewards)
        for idx, good in split_groups(trajs, rewards):
            values = {k: [v[i] for i in idx] for k, v in parts.items()}
            ref = None if reference is None else [reference[i] for i in idx]
            group = ([trajs[i] for i in idx], [rewards[i] for i in idx], values, ref)
            (self.kept if good else self.uniform).append(group)
            self.generated += 1

    def batch(self, groups: int) -> tuple[StepBatch, dict, int, int]:
        """(the trained batch, its parts, informative groups, uniform groups): the first `groups` informative
        groups, topped up with uniform ones."""
        chosen = self.kept[:groups]
        chosen = chosen + self.uniform[: groups - len(chosen)]
        trajs = [t for g in chosen for t in g[0]]
        rewards = [r for g in chosen for r in g[1]]
        names = chosen[0][2] if chosen else {}
        parts = {k: [v for g in chosen for v in g[2].get(k, [])] for k in names}
        ref = None if any(g[3] is None for g in chosen) else [lp for g in chosen for lp in g[3]]
        kept = min(len(self.kept), groups)
        return StepBatch(trajs, rewards, ref), parts, kept, len(chosen) - kept


class DynamicSampling:
    """The step's batch, scored: `batch(host, pipeline, step, version, timer, row)` -> StepBatch.

    Off (`algo.dynamic_sampling.enabled` false): the pipeline's batch, scored. On: the rounds of the module
    docstring; the host's `reward_parts` hold the trained batch's per-function values."""

    def __init__(self, cfg):
        self.cfg = cfg.algo.dynamic_sampling
        self.prompts_per_step = cfg.rollout.prompts_per_step
        self.warned = False

    def batch(self, host: Host, pipeline: Rounds, step: int, version: int, timer, row: dict) -> StepBatch:
        pool, rows, sizes = Pool(), [], []
        for round_ in range(self.cfg.max_rounds if self.cfg.enabled else 1):
            rows.append(row if not self.cfg.enabled else {"step": step})
            with timer.phase("generate"):  # round 0: the wait for this step's batch (prefetched: usually ready)
                trajs = pipeline.take(step, version, rows[-1]) if round_ == 0 else \
                    pipeline.more(step, round_, version, rows[-1], self.prompts_per_step - len(pool.kept))
            with timer.phase("reward"):  # stream: its groups were scored as they completed; waits for the rest
                scored = pipeline.scores(rows[-1])
                rewards = host.score(trajs, rows[-1], scored and scored.reward)
            reference = scored.reference if scored else None
            if not self.cfg.enabled:
                return StepBatch(trajs, rewards, reference)
            pool.add(trajs, rewards, host.reward_parts, reference)
            sizes.append(len(trajs))
            if len(pool.kept) >= self.prompts_per_step:
                break
        batch, host.reward_parts, kept, padded = pool.batch(self.prompts_per_step)
        row.update(merge_round_rows(rows, sizes))
        row.update({"rollout/dyn_groups_generated": pool.generated, "rollout/dyn_groups_kept": kept,
                    "rollout/dyn_groups_padded": padded, "rollout/dyn_rounds": len(rows)})
        if padded and not self.warned:
            self.warned = True
            print(f"algo.dynamic_sampling: step {step} found {kept} informative groups of {self.prompts_per_step} in "
                  f"max_rounds={self.cfg.max_rounds} rounds; it trains on them plus {padded} uniform groups "
                  "(rollout/dyn_groups_padded; warned once)", flush=True)
        return batch


_AVERAGED = ("/mean", "_mean", "_frac", "_rate", "_per_s")  # but *_s_mean: seconds (the rollout's busy time), summed
# the pipelines' gauges and running counters (orchestrator/rollout/async_pipeline.py, stream_buffer.py): the last round's
_LAST = ("async/weight_version", "async/dropped_batches", "async/buffer_groups", "async/in_flight_groups",
         "async/dropped_groups", "async/dropped_samples", "rollout/queue_depth")


def merge_round_rows(rows: list[dict], sizes: list[int]) -> dict:
    """One row from the rounds' rows, weighted by their samples `sizes`: memory/*, *_max and staleness the largest,
    reward/std pooled over every sample (from each round's reward/mean and reward/std), means / fractions / rates the
    sample-weighted mean, the pipelines' gauges and running counters (`_LAST`) and non-numbers the last round's,
    everything else (counts, seconds) the sum. One round: its row, unchanged."""
    if len(rows) == 1:
        return {k: v for k, v in rows[0].items() if k != "step"}
    out: dict = {}
    for key in dict.fromkeys(k for r in rows for k in r if k != "step"):
        have = [(r[key], n) for r, n in zip(rows, sizes) if key in r]
        if key in _LAST or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v, _ in have):
            out[key] = have[-1][0]
        elif key.startswith("memory/") or key.endswith(("_max", "staleness", "max_staleness_seen")):
            out[key] = max(v for v, _ in have)
        elif key == "reward/std":
            out[key] = pooled_std(rows, sizes)
        elif key.endswith(_AVERAGED) and not key.endswith("_s_mean"):
            out[key] = sum(v * n for v, n in have) / sum(n for _, n in have)
        else:
            out[key] = sum(v for v, _ in have)
    return out


def pooled_std(rows: list[dict], sizes: list[int]) -> float:
    """The unbiased std of every sample's reward from each round's (reward/mean, reward/std, size)."""
    parts = [(r.get("reward/mean", 0.0), r.get("reward/std", 0.0), n) for r, n in zip(rows, sizes)]
    total = sum(n for _, _, n in parts)
    if total < 2:
        return 0.0
    mean = sum(m * n for m, _, n in parts) / total
    ss = sum((n - 1) * s * s + n * (m - mean) ** 2 for m, s, n in parts)
    return math.sqrt(max(ss, 0.0) / (total - 1))
