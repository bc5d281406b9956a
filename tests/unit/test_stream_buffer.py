"""Partial samples (orchestrator/rollout/partial.py) and the fully asynchronous group buffer
(orchestrator/rollout/stream_buffer.py): per-token versions and behaviour logprobs across an interruption,
the staleness bound under random delays, no sample lost or counted twice.

    .venv/bin/python -m pytest tests/unit/test_stream_buffer.py -q
"""
from __future__ import annotations

import random

import pytest

from orchestrator.rollout.partial import PartialSample, samples_of
from orchestrator.rollout.seeds import resume_seed, sample_seed
from orchestrator.rollout.stream_buffer import GroupBuffer
from orchestrator.rollout.types import PromptRequest, SamplingOverride


def _req(gid: int, seed=None) -> PromptRequest:
    return PromptRequest(group_id=gid, prompt_ids=[1, 2, 3], answer="5", prompt="2+3?", seed=seed)


def _finished(gid: int, index: int, versions: list[int]) -> PartialSample:
    s = PartialSample(_req(gid), index, max_tokens=len(versions))
    for v in versions:
        s.extend([10 + v], [-0.5], v)
    s.finish("length")
    return s


def test_a_sample_continues_across_an_interruption_with_each_tokens_version_and_logprob():
    s = PartialSample(_req(7, seed=123), index=2, max_tokens=5)
    assert s.prompt_ids == [1, 2, 3] and s.remaining == 5 and s.seed == sample_seed(123, 2)
    s.extend([40, 41], [-0.1, -0.2], version=3)
    s.finish("length")  # the segment's own max_tokens, not the sample's budget (3 tokens left): not done
    assert not s.done
    s.interrupted()
    assert s.prompt_ids == [1, 2, 3, 40, 41] and s.remaining == 3 and s.seed == resume_seed(sample_seed(123, 2), 2)
    s.extend([42, 2], [-0.3, -0.4], version=4)
    s.finish("stop")
    t = s.to_trajectory("text")
    assert t.response_ids == [40, 41, 42, 2] and t.logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert t.token_versions == [3, 3, 4, 4] and t.weight_version == 3 and t.finish_reason == "stop"
    assert t.prompt_ids == [1, 2, 3] and s.num_versions == 2 and s.interruptions == 1 and s.key == "7:2"


def test_partial_sample_refuses_what_would_corrupt_it():
    s = PartialSample(_req(1), 0, max_tokens=2)
    with pytest.raises(ValueError, match="2 ids but 1 logprobs"):
        s.extend([1, 2], [-1.0], 0)
    with pytest.raises(ValueError, match="exceed the 2 left"):
        s.extend([1, 2, 3], [-1.0] * 3, 0)
    s.extend([1], [-1.0], 2)
    with pytest.raises(ValueError, match="older than its last token's 2"):
        s.extend([1], [-1.0], 1)
    with pytest.raises(ValueError, match="still generating"):
        s.to_trajectory()
    with pytest.raises(ValueError, match="finish reason 'abort'"):
        s.finish("abort")
    s.extend([5], [-1.0], 2)
    s.finish("length")
    assert s.done and s.remaining == 0
    with pytest.raises(ValueError, match="is finished"):
        s.extend([1], [-1.0], 2)
    assert s.seed is None  # unseeded request


def test_samples_of_a_request_follow_its_sampling_override():
    assert [s.index for s in samples_of(_req(1), 3, 16)] == [0, 1, 2]
    req = PromptRequest(group_id=2, prompt_ids=[1], answer="", sampling=SamplingOverride(n=2, temperature=0.0,
                                                                                          max_new_tokens=4))
    assert [(s.index, s.max_tokens) for s in samples_of(req, 8, 16)] == [(0, 4), (1, 4)]


def test_buffer_admits_by_the_oldest_token_and_drops_over_the_bound():
    buf = GroupBuffer(max_staleness=1, prompts_per_step=1)
    assert buf.capacity(0) == 2
    buf.submit(1, 2), buf.submit(2, 2)
    assert buf.capacity(0) == 0
    buf.add(_finished(1, 0, [0, 0, 1]))
    assert buf.take(1, policy_version=1) is None  # group 1 incomplete
    buf.add(_finished(1, 1, [1, 1]))
    batch = buf.take(1, policy_version=1)
    assert [g.group_id for g in batch.groups] == [1]
    m = buf.metrics(batch)
    assert (m["async/staleness_1"], m["async/staleness_0"], m["async/staleness_max"]) == (1.0, 1.0, 1.0)
    assert (m["async/multi_version_samples"], m["async/multi_version_tokens"]) == (1.0, 3.0)
    assert m["async/policy_version_mean"] == 3 / 5  # tokens of versions 0, 0, 1, 1, 1
    buf.add(_finished(2, 0, [0])), buf.add(_finished(2, 1, [2]))
    assert buf.take(1, policy_version=2) is None  # group 2 started at version 0: staleness 2 > 1, dropped
    assert (buf.dropped_groups, buf.dropped_samples, buf.started) == (1, 2, 1)
    assert buf.capacity(2) == 3  # its slot freed: (2 + 1 + 1) * 1 - 1


@pytest.mark.parametrize("wait_for_due", [True, False])
def test_a_group_due_now_is_waited_for_rather_than_passed_over_and_dropped(wait_for_due):
    """k = 1, 2 groups a step. At the take of version 1, group 1 (complete) and group 2 (one sample still running)
    started at version 0: over the bound at the next step. Group 3 (version 1) is complete first. Passing group 2
    over for group 3 (the old completion-order take, and `wait_for_due=False`) drops group 2 at the next take; the
    default waits for it. A k = 1 run on the demo showed the drop and the pipeline then a group short every step."""
    buf = GroupBuffer(max_staleness=1, prompts_per_step=2)
    for gid in (1, 2, 3):
        buf.submit(gid, 2)
    buf.add(_finished(1, 0, [0])), buf.add(_finished(1, 1, [0]))
    buf.add(_finished(2, 0, [0, 0, 1]))  # its sample 1 is still being generated
    buf.add(_finished(3, 0, [1])), buf.add(_finished(3, 1, [1]))
    batch = buf.take(2, policy_version=1, wait_for_due=wait_for_due)
    if not wait_for_due:
        assert [g.group_id for g in batch.groups] == [1, 3]
        buf.add(_finished(2, 1, [1, 1]))
        assert buf.take(1, policy_version=2) is None and buf.dropped_groups == 1  # its work lost
        return
    assert batch is None and buf.dropped_groups == 0  # a slot kept for group 2
    buf.add(_finished(2, 1, [1, 1]))
    batch = buf.take(2, policy_version=1)
    assert [g.group_id for g in batch.groups] == [1, 2] and [g.group_id for g in buf.ready] == [3]
    assert [g.group_id for g in buf.take(1, policy_version=2).groups] == [3] and buf.dropped_groups == 0


def test_awaited_names_the_groups_a_take_still_needs_due_ones_first_then_the_oldest():
    """What the engines are told to run first while the trainer waits (orchestrator/rollout/stream_source.py): a
    take of 3 at version 1 with group 1 ready needs two more; group 4 (a sample of version 0: due now) first, then
    group 2, the oldest other. Nothing once the ready groups fill the take; groups over the bound count for nothing."""
    buf = GroupBuffer(max_staleness=1, prompts_per_step=3)
    for gid in (1, 2, 3, 4):
        buf.submit(gid, 2)
    buf.add(_finished(1, 0, [1])), buf.add(_finished(1, 1, [1]))
    buf.add(_finished(4, 0, [0, 1]))
    assert buf.awaited(3, policy_version=1) == [4, 2]
    assert buf.awaited(1, policy_version=1) == [] and buf.awaited(4, policy_version=1) == [4, 2, 3]
    # at version 3 groups 1 and 4 are over the bound: group 1 fills nothing, group 4 is not waited for
    assert buf.awaited(2, policy_version=3) == [2, 3] and buf.awaited(4, policy_version=3) == [2, 3]
    assert buf.take(1, policy_version=1, wait_for_due=False).groups[0].group_id == 1  # awaited changed nothing


def test_buffer_counts_every_sample_once():
    buf = GroupBuffer(max_staleness=2, prompts_per_step=2)
    buf.submit(5, 2)
    with pytest.raises(ValueError, match="already in the buffer"):
        buf.submit(5, 2)
    buf.add(_finished(5, 0, [0]))
    with pytest.raises(ValueError, match="duplicate"):
        buf.add(_finished(5, 0, [0]))
    with pytest.raises(ValueError, match="not in flight"):
        buf.add(_finished(6, 0, [0]))
    unfinished = PartialSample(_req(5), 1, 3)
    with pytest.raises(ValueError, match="only finished samples"):
        buf.add(unfinished)
    with pytest.raises(ValueError, match="max_staleness=0"):
        GroupBuffer(0, 2)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_staleness_bound_holds_and_nothing_is_lost_under_random_delays(k):
    """Engines finish samples after random delays (some very long) while the trainer takes batches and bumps the
    version; samples in flight at a version change continue on the new version (partial rollouts). Every trained
    sample is within k; every submitted group ends trained, dropped or still in the buffer; no sample twice."""
    rng, per_step, n, steps = random.Random(k), 3, 2, 40
    buf, version, gid, trained = GroupBuffer(k, per_step), 0, 0, []
    in_flight: list[tuple[float, PartialSample]] = []  # (time left, sample)
    clock_groups: dict[int, int] = {}
    while version < steps:
        for _ in range(buf.capacity(version)):
            gid += 1
            buf.submit(gid, n)
            clock_groups[gid] = version
            in_flight += [(rng.expovariate(1.0) * (20 if rng.random() < 0.1 else 1), s) for s in samples_of(_req(gid), n, 1000)]
        in_flight.sort(key=lambda x: x[0])
        tick = in_flight[0][0]  # advance to the next finish
        still = []
        for left, s in in_flight:
            s.extend([1], [-1.0], version)  # one token per version it lives through
            if left <= tick:
                s.finish("stop")
                buf.add(s)
            else:
                still.append((left - tick, s))
        in_flight = still
        batch = buf.take(per_step, version)
        if batch is not None:
            assert all(version - s.first_version <= k for s in batch.samples)
            assert all(s.first_version >= clock_groups[s.request.group_id] for s in batch.samples)
            trained += [s.key for s in batch.samples]
            version += 1  # the update: in-flight samples continue on the new weights
    assert buf.trained_groups >= steps * per_step and len(trained) == len(set(trained)) == buf.trained_groups * n
    if k == 1:  # the long tails outlive a bound of 1: the drop path runs
        assert buf.dropped_groups > 0
    pending = sum(len(g.samples) for g in buf.pending.values())
    ready = sum(len(g.samples) for g in buf.ready)
    assert len(trained) + buf.dropped_samples + ready + pending + len(in_flight) == gid * n


def test_restart_empties_an_in_flight_group_and_refuses_others():
    buf = GroupBuffer(max_staleness=1, prompts_per_step=1)
    buf.submit(1, 2)
    first, second = samples_of(_req(1), 2, 4)
    first.extend([5], [-0.1], 0)
    first.finish("stop")
    buf.add(first)
    buf.restart(1)  # its engine was lost: the group is generated again, whole
    assert buf.pending[1].samples == {} and buf.started == 1
    second.extend([6], [-0.2], 0)
    second.finish("stop")
    buf.add(first)  # the regenerated samples enter once each
    buf.add(second)
    assert buf.take(1, 0) is not None
    with pytest.raises(ValueError, match="group 1 is not in flight"):
        buf.restart(1)


def test_failed_samples_complete_their_group_and_are_counted_but_never_trained():
    from orchestrator.rollout.partial_episode import FailedEpisode

    buf = GroupBuffer(max_staleness=1, prompts_per_step=2)
    a, b = PromptRequest(0, [1], ""), PromptRequest(1, [1], "")
    buf.submit(0, 2)
    buf.submit(1, 2)
    buf.add(FailedEpisode(a, 0))
    assert buf.take(2, 5) is None  # group 0 is not complete yet
    buf.add(_finished(0, 1, [4]))
    buf.add(FailedEpisode(b, 0))
    buf.add(FailedEpisode(b, 1))  # every sample of group 1 failed: it completes, staleness 0
    batch = buf.take(2, 5)
    assert [s.key for s in batch.samples] == ["0:1"] and [s.key for s in batch.failed] == ["0:0", "1:0", "1:1"]
    m = buf.metrics(batch)
    assert m["async/staleness_1"] == 1.0 and m["async/staleness_max"] == 1.0 and buf.dropped_groups == 0
    buf.submit(2, 2)
    buf.add(FailedEpisode(PromptRequest(2, [1], ""), 0))
    with pytest.raises(ValueError, match="duplicate"):  # a failed slot is counted once, like any sample
        buf.add(FailedEpisode(PromptRequest(2, [1], ""), 0))
