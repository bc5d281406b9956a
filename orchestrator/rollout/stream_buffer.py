"""The group buffer of fully asynchronous training (`algo.max_staleness: k`): rollout workers generate
continuously, finished samples are assembled into groups, and the trainer takes a batch as soon as
`rollout.prompts_per_step` groups are ready. Pure Python (no Ray, no torch);
`tests/unit/test_stream_buffer.py` drives it with random delays.

    buf = GroupBuffer(max_staleness=2, prompts_per_step=8)
    for request in prompts[: buf.capacity(policy_version)]:    # how many groups may start now
        buf.submit(request.group_id, n)                         # ... and hand the request to an engine
    buf.add(sample)                                             # a finished PartialSample (any order)
    batch = buf.take(8, policy_version)                         # None until 8 admissible groups are ready
    row.update(buf.metrics(batch))

Versions count policy updates as in orchestrator/rollout/async_pipeline.py: the trainer at step t trains the
policy of version t - 1, and a sample's *staleness* is that version minus the version of its first token
(the oldest; partial rollouts continue on newer weights, orchestrator/rollout/partial.py).

Capacity (AReaL's rule, Fu et al. 2025 sec. 5.2): groups are started only while the groups started so far
(dropped ones excepted) number at most (policy_version + k + 1) * prompts_per_step. Groups are taken in
the order they complete, except that a group due at this step (over the bound at the next one) goes first and is
waited for while still in flight, rather than passed over by later groups and dropped (which also left the
pipeline a group short for the rest of a run: benchmarks/RESULTS.md); so the bound rarely bites. Admission: every
group taken whose staleness exceeds k is dropped (counted in `async/dropped_groups` and `async/dropped_samples`,
its slot freed) and never trained. Every sample is counted once: a second sample with the same key, a sample of a
group never submitted or more samples than the group holds raise ValueError.

A sample with `failed` set (a streamed episode whose environment never started, orchestrator/rollout/
partial_episode.py `FailedEpisode`) fills its slot, so its group completes, but is never trained: `Batch.samples`
leaves it out, `Batch.failed` lists it, and a group's staleness is that of its other samples (0 when it has none,
so such a group is taken, and its failures counted, with the batch).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.rollout.partial import PartialSample


DUE_WAIT_S = 60.0  # how long a take waits for groups due now still in flight (orchestrator/rollout/stream_source.py)


@dataclass
class Group:
    """One submitted group: its expected size and its finished samples (by sample index)."""

    group_id: int
    size: int
    samples: dict[int, PartialSample] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.samples) == self.size

    @property
    def trained(self) -> list[PartialSample]:
        """The samples to train, by index (failed ones left out)."""
        return [self.samples[i] for i in sorted(self.samples) if not _failed(self.samples[i])]

    def staleness(self, policy_version: int) -> int:
        """policy_version - the oldest first-token version of its trained samples (0 when it has none)."""
        versions = [s.first_version for s in self.samples.values() if not _failed(s)]
        return policy_version - min(versions) if versions else 0


@dataclass
class Batch:
    """What `take` returns: the admitted groups in completion order and the staleness of each sample."""

    groups: list[Group]
    policy_version: int

    @property
    def samples(self) -> list[PartialSample]:
        """The samples to train, by group then index (failed ones left out)."""
        return [s for g in self.groups for s in g.trained]

    @property
    def failed(self) -> list:
        """The failed samples (never trained), by group then index."""
        return [g.samples[i] for g in self.groups for i in sorted(g.samples) if _failed(g.samples[i])]


def _failed(sample) -> bool:
    return bool(getattr(sample, "failed", False))


class GroupBuffer:
    """Finished samples -> complete groups -> admitted batches (see the module docstring).

    Args:
        max_staleness: k >= 1 (`algo.max_staleness`), the largest staleness trained.
        prompts_per_step: groups per training batch (`rollout.prompts_per_step`), >= 1.
    Raises:
        ValueError: k < 1 or prompts_per_step < 1.
    """

    def __init__(self, max_staleness: int, prompts_per_step: int):
        if not (isinstance(max_staleness, int) and max_staleness >= 1):
            raise ValueError(f"algo.max_staleness={max_staleness!r}: fully asynchronous training needs an integer >= 1")
        if not (isinstance(prompts_per_step, int) and prompts_per_step >= 1):
            raise ValueError(f"rollout.prompts_per_step={prompts_per_step!r} must be an integer >= 1")
        self.k, self.per_step = max_staleness, prompts_per_step
        self.pending: dict[int, Group] = {}  # submitted, not complete
        self.ready: list[Group] = []  # complete, in completion order, not taken
        self.started = 0  # groups submitted and not dropped (the capacity rule counts them)
        self.dropped_groups = self.dropped_samples = 0
        self.trained_groups = 0

    def capacity(self, policy_version: int) -> int:
        """How many more groups may start now (>= 0): (policy_version + k + 1) * prompts_per_step - started."""
        return max(0, (policy_version + self.k + 1) * self.per_step - self.started)

    def submit(self, group_id: int, size: int) -> None:
        """Group `group_id` of `size` samples was handed to an engine. Raises ValueError for a group id already
        in the buffer or a size < 1."""
        if group_id in self.pending or any(g.group_id == group_id for g in self.ready):
            raise ValueError(f"group {group_id} is already in the buffer: group ids must be unique")
        if size < 1:
            raise ValueError(f"group {group_id}: size={size} must be >= 1")
        self.pending[group_id] = Group(group_id, size)
        self.started += 1

    def restart(self, group_id: int) -> None:
        """Forget the finished samples of in-flight group `group_id` (its engine was lost; the whole group is
        generated again). Raises ValueError for a group not in flight."""
        if group_id not in self.pending:
            raise ValueError(f"group {group_id} is not in flight (never submitted, or complete): cannot restart it")
        self.pending[group_id].samples.clear()

    def add(self, sample: PartialSample) -> None:
        """A finished sample (or a failed one, see the module docstring). Raises ValueError when it is not finished,
        has no tokens and is not failed, its group was never submitted (or already complete) or its index is
        already there."""
        gid = sample.request.group_id
        if not sample.done or (sample.first_version is None and not _failed(sample)):
            raise ValueError(f"sample {sample.key}: only finished samples with tokens (or failed ones) enter the buffer")
        group = self.pending.get(gid)
        if group is None:
            raise ValueError(f"sample {sample.key}: group {gid} is not in flight (never submitted, or complete)")
        if sample.index in group.samples or not 0 <= sample.index < group.size:
            raise ValueError(f"sample {sample.key}: index {sample.index} is a duplicate or outside the group's "
                             f"{group.size} samples")
        group.samples[sample.index] = sample
        if group.complete:
            self.ready.append(self.pending.pop(gid))

    def take(self, count: int, policy_version: int, wait_for_due: bool = True) -> Optional[Batch]:
        """`count` admissible complete groups (completion order), or None while too few are ready. Every ready group
        over the staleness bound is dropped for good (counted), whether or not the batch fills. A group due now
        (admissible now, over the bound at the next step) goes first, and with `wait_for_due` one still in flight is
        waited for (a slot kept for it) rather than passed over by groups that can wait: passed over, it would be
        dropped at the next step and its work lost. The caller stops waiting after DUE_WAIT_S (an engine held after
        a failed verification finishes nothing)."""
        admitted = []
        for g in self.ready:
            if g.staleness(policy_version) > self.k:
                self.dropped_groups += 1
                self.dropped_samples += g.size
                self.started -= 1
            else:
                admitted.append(g)
        chosen = {id(g) for g in [g for g in admitted if self._due(g, policy_version)][:count]}  # due now
        # a pending group's finished samples decide (one with none yet is not waited for)
        awaited = sum(self._due(g, policy_version) for g in self.pending.values()) if wait_for_due else 0
        can_wait = [g for g in admitted if id(g) not in chosen][:max(0, count - len(chosen) - awaited)]
        chosen |= {id(g) for g in can_wait}
        if len(chosen) < count:
            self.ready = admitted
            return None
        self.ready = [g for g in admitted if id(g) not in chosen]
        self.trained_groups += count
        return Batch([g for g in admitted if id(g) in chosen], policy_version)

    def release(self, count: int) -> None:
        """`count` groups taken will not be trained (a step's group filter takes more than it trains,
        orchestrator/rollout/dynamic_sampling.py): their slots start new groups. Raises ValueError past the groups
        taken."""
        if not 0 <= count <= self.trained_groups:
            raise ValueError(f"release({count}): only {self.trained_groups} groups were taken")
        self.started -= count
        self.trained_groups -= count

    def awaited(self, count: int, policy_version: int) -> list[int]:
        """The in-flight groups a take of `count` groups at `policy_version` waits for: as many as the admissible
        ready groups leave missing, due ones first (see `take`), then in the order they were submitted (the oldest
        are the furthest along); none already over the bound (dropped when complete). [] when the ready groups fill
        the take. Does not change the buffer."""
        ready = sum(g.staleness(policy_version) <= self.k for g in self.ready)
        live = [g for g in self.pending.values() if g.staleness(policy_version) <= self.k]
        ordered = sorted(live, key=lambda g: not self._due(g, policy_version))  # stable: submission order
        return [g.group_id for g in ordered[:max(0, count - ready)]]

    def _due(self, group: Group, policy_version: int) -> bool:
        """Admissible at this take (policy_version) and over the bound at the next one: trained now or dropped."""
        return group.staleness(policy_version) <= self.k < group.staleness(policy_version + 1)

    def metrics(self, batch: Batch) -> dict[str, float]:
        """The `async/*` keys of a trained batch: `async/staleness_mean`, `_max`, the histogram
        `async/staleness_<s>` (samples of staleness s, s = 0 .. k), `async/buffer_groups` (complete, waiting),
        `async/in_flight_groups`, `async/dropped_groups`, `async/dropped_samples` (cumulative),
        `async/multi_version_samples` and `async/multi_version_tokens` (samples of the batch generated under
        more than one weight version, and their tokens), `async/policy_version_mean` (the mean weight version of
        the batch's sampled tokens: the policy whose reward the batch measures, benchmarks/async_rl.py)."""
        stale = [batch.policy_version - s.first_version for s in batch.samples]
        hist = Counter(stale)
        multi = [s for s in batch.samples if s.num_versions > 1]
        out = {f"async/staleness_{s}": float(hist.get(s, 0)) for s in range(self.k + 1)}
        out.update({"async/staleness_mean": sum(stale) / max(len(stale), 1),
                    "async/staleness_max": float(max(stale, default=0)),
                    "async/buffer_groups": float(len(self.ready)), "async/in_flight_groups": float(len(self.pending)),
                    "async/dropped_groups": float(self.dropped_groups), "async/dropped_samples": float(self.dropped_samples),
                    "async/multi_version_samples": float(len(multi)),
                    "async/multi_version_tokens": float(sum(len(s.response_ids) for s in multi))})
        versions = [v for s in batch.samples for v in _sampled_versions(s)]
        if versions:
            out["async/policy_version_mean"] = sum(versions) / len(versions)
        return out


def _sampled_versions(sample) -> list[int]:
    """The weight version of each sampled token (a PartialSample's `token_versions`; an EpisodeSample's
    `sampled_versions`, observation ids left out)."""
    if hasattr(sample, "sampled_versions"):
        return sample.sampled_versions
    return list(sample.token_versions)
