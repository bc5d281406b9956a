"""AsyncRollouts (orchestrator/rollout/async_source.py) over a fake rollout source: no Ray, engines simulated.

The fake engines stamp each sample with the version they hold at launch, as the real RolloutWorker does.
"""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from orchestrator.rollout.async_source import AsyncRollouts
from orchestrator.rollout.pending import unpack
from orchestrator.rollout.source import RolloutSource
from orchestrator.data import StatefulLoader
from orchestrator.rollout import PromptRequest, Trajectory
from orchestrator.weight_sync import WeightMismatchError


class FakeController:
    def __init__(self, max_staleness=1, total=4, start_step=0, generate_s=2.0):
        self.cfg = OmegaConf.create({"algo": {"max_staleness": max_staleness}, "trainer": {"total_steps": total}})
        self.start_step, self.version, self.engine_version = start_step, start_step, start_step
        self.loader = StatefulLoader(list(range(20)), 2, seed=0, shuffle=True)
        self.generate_s, self.launches = generate_s, []

    def sample_prompts(self, step):
        return [PromptRequest(group_id=step * 2 + i, prompt_ids=[k + 3], answer="") for i, k in
                enumerate(self.loader.next_batch())]

    def sync(self, step):  # weight sync `step`: trainer and engines move to it
        self.version = self.engine_version = step


class FakeSource(RolloutSource):
    """Engines that return at once, stamping each sample with the controller's engine version at launch."""

    def __init__(self, ctl):
        super().__init__(ctl.cfg, [None], wait=lambda refs: refs)
        self.ctl = ctl

    def _shards(self, requests):
        return [(0, requests)]

    def _call(self, worker, requests):
        self.ctl.launches.append([r.group_id for r in requests])
        trajs = [Trajectory(group_id=r.group_id, prompt_ids=r.prompt_ids, response_ids=[1], logprobs=[-1.0], text="",
                            finish_reason="stop", answer="", weight_version=self.ctl.engine_version) for r in requests]
        return (trajs, {"rollout/generate_s": self.ctl.generate_s})

    def _metrics(self, launched, trajs):
        return {}


def _rollouts(ctl):
    return AsyncRollouts(FakeSource(ctl), ctl.sample_prompts, ctl.loader, ctl.cfg, ctl.start_step)


def _step(ctl, rollouts, step):
    row = {}
    rollouts.launch(step)
    trajs = rollouts.take(step, ctl.version, row)
    rollouts.finish_in_flight(row)
    ctl.sync(step)
    rollouts.synced(step)
    return trajs, row


def test_one_step_off_rows_and_group_ids():
    ctl = FakeController()
    rollouts = _rollouts(ctl)
    rows = []
    for step in (1, 2, 3, 4):
        trajs, row = _step(ctl, rollouts, step)
        assert [t.group_id for t in trajs] == [2 * step, 2 * step + 1]  # each step trains its own prompts
        rows.append(row)
    assert [r["async/staleness"] for r in rows] == [0, 1, 1, 1]
    assert [r["async/weight_version"] for r in rows] == [0, 0, 1, 2]
    assert len(ctl.launches) == 4  # batches 1..4 once each, none past trainer.total_steps
    # the fake generation returns at once: all 2 s of batch k + 1 are hidden; step 4 generated nothing
    assert [r["async/overlap_s"] for r in rows] == pytest.approx([2.0, 2.0, 2.0, 0.0], abs=1e-3)
    assert [r["rollout/worker_generate_s_mean"] for r in rows] == [2.0, 2.0, 2.0, 0.0]


def test_a_wrong_engine_version_is_still_caught():
    ctl = FakeController()
    rollouts = _rollouts(ctl)
    _step(ctl, rollouts, 1)
    rollouts.launch(2)  # batch 3 launched on version 1
    ctl.engine_version = 7  # ...but the engines hold something else
    rollouts.batches[3].launched = rollouts.source.launch(rollouts.batches[3].launched.requests)
    rollouts.take(2, ctl.version, {})
    rollouts.finish_in_flight({})
    ctl.sync(2)
    rollouts.synced(2)
    rollouts.launch(3)
    with pytest.raises(WeightMismatchError, match="expected 1"):
        rollouts.take(3, ctl.version, {})


def test_checkpoint_loader_state_and_discard_rewind_to_the_pending_batch():
    ctl = FakeController(total=5)
    rollouts = _rollouts(ctl)
    _step(ctl, rollouts, 1)
    after_batch_1 = rollouts.loader_state()  # batch 2 is pending: the loader before its prompts
    assert after_batch_1["position"] == 2 and ctl.loader.state_dict()["position"] == 4
    pending = rollouts.batches[2].launched.requests
    assert rollouts.discard(engine_version=1) == [2]
    assert ctl.loader.state_dict() == after_batch_1
    trajs, row = _step(ctl, rollouts, 2)  # regenerated on the current weights: staleness 0, same prompts
    assert [t.group_id for t in trajs] == [r.group_id for r in pending]
    assert [t.prompt_ids for t in trajs] == [r.prompt_ids for r in pending]
    assert row["async/staleness"] == 0 and row["async/dropped_batches"] == 1


def test_max_staleness_zero_never_prefetches():
    ctl = FakeController(max_staleness=0)
    rollouts = _rollouts(ctl)
    for step in (1, 2, 3):
        _, row = _step(ctl, rollouts, step)
        assert row["async/staleness"] == 0 and row["async/overlap_s"] == 0.0
        assert len(ctl.launches) == step and rollouts.loader_state() is None


def _run_to(ctl, rollouts, steps):
    return [_step(ctl, rollouts, s) for s in steps]


def test_a_resume_trains_the_checkpoints_pending_batch_exactly():
    """Checkpoint after step 2 of 4 (batch 3 generated by version 1, pending), resume: steps 3-4 train the
    same samples, with the same weight versions and staleness, as the uninterrupted run."""
    whole_ctl = FakeController(total=4)
    whole = _run_to(whole_ctl, _rollouts(whole_ctl), (1, 2, 3, 4))

    ctl = FakeController(total=4)
    first = _rollouts(ctl)
    _run_to(ctl, first, (1, 2))
    state = first.state_dict()
    assert state is not None and state["loader"] == ctl.loader.state_dict()  # after batch 3's prompts
    assert first.loader_state()["position"] == 4  # the loader before them (what a regenerating resume needs)

    resumed_ctl = FakeController(total=4, start_step=2)  # a new process: fresh loader, engines on version 2
    resumed = _rollouts(resumed_ctl)
    resumed.load_state_dict(state)
    split = _run_to(resumed_ctl, resumed, (3, 4))
    for (a_trajs, a_row), (b_trajs, b_row) in zip(whole[2:], split):
        assert b_trajs == a_trajs  # the same Trajectory objects' contents (ids, logprobs, versions)
        for k in ("async/staleness", "async/weight_version", "async/max_staleness_seen", "async/dropped_batches",
                  "rollout/queue_depth"):
            assert b_row[k] == a_row[k], k
    assert [t.weight_version for t in split[0][0]] == [1, 1]  # generated before the checkpoint, not regenerated
    assert resumed_ctl.launches == [[8, 9]]  # only batch 4 was generated after the resume
    assert resumed_ctl.loader.state_dict() == whole_ctl.loader.state_dict()


def test_no_pending_state_while_a_batch_generates_or_when_none_is_pending():
    ctl = FakeController(total=3)
    rollouts = _rollouts(ctl)
    assert rollouts.state_dict() is None
    rollouts.launch(1)
    assert rollouts.state_dict() is None  # batches 1 and 2 launched, not fetched: a resume regenerates them
    rollouts.take(1, ctl.version, {})
    rollouts.finish_in_flight({})
    assert rollouts.state_dict()["loader"] == ctl.loader.state_dict()
    ctl.sync(1)
    rollouts.synced(1)
    _run_to(ctl, rollouts, (2, 3))
    assert rollouts.state_dict() is None  # the last step: nothing launched past trainer.total_steps


def test_a_resume_with_fewer_total_steps_drops_the_pending_batch_past_them():
    ctl = FakeController(total=4)
    first = _rollouts(ctl)
    _run_to(ctl, first, (1, 2))
    resumed_ctl = FakeController(total=2, start_step=2)
    resumed = _rollouts(resumed_ctl)
    resumed.load_state_dict(first.state_dict())
    assert resumed.batches == {} and resumed.state_dict() is None


def test_sync_mode_generates_each_step_on_the_weights_it_trains_and_keeps_nothing_pending():
    from orchestrator.rollout.async_source import SyncRollouts

    ctl = FakeController(max_staleness=3)  # the bound does not matter in sync mode: staleness is 0
    rollouts = SyncRollouts(FakeSource(ctl), ctl.sample_prompts, ctl.loader, ctl.cfg, ctl.start_step)
    for step in (1, 2, 3):
        rollouts.launch(step)
        assert rollouts.state_dict() is None and len(ctl.launches) == step  # its own batch, launched now
        row = {"rollout/worker_generate_s_mean": 2.0}
        trajs = rollouts.take(step, ctl.version, row)
        assert [t.group_id for t in trajs] == [2 * step, 2 * step + 1] and {t.weight_version for t in trajs} == {step - 1}
        rollouts.finish_in_flight(row)  # nothing in flight: the row's generate seconds stay the step's
        assert row["rollout/staleness"] == 0 and row["rollout/worker_generate_s_mean"] == 2.0
        assert not any(k.startswith("async/") for k in row)
        assert rollouts.loader_state() is None and rollouts.state_dict() is None
        ctl.sync(step)
        rollouts.synced(step)


def test_a_dynamic_sampling_round_in_one_step_off_mode_is_generated_now_on_the_engines_weights():
    ctl = FakeController(max_staleness=1, total=4)
    ctl.sample_prompts = lambda step, round_=0: [PromptRequest(group_id=1000 * round_ + step * 2 + i, prompt_ids=[k],
                                                               answer="") for i, k in enumerate(ctl.loader.next_batch())]
    rollouts = _rollouts(ctl)
    _step(ctl, rollouts, 1)
    rollouts.launch(2)  # the batch of step 3 goes out on weights 1
    rollouts.take(2, ctl.version, {})
    row = {}
    extra = rollouts.more(2, 1, ctl.version, row, groups=1)  # a whole round of prompts_per_step groups
    assert [t.group_id for t in extra] == [1004, 1005] and {t.weight_version for t in extra} == {1}  # staleness 0
    assert row["rollout/worker_restarts"] == 0 and 3 in rollouts.batches  # the next step's batch is untouched
    rollouts.finish_in_flight({})
    state = rollouts.state_dict()  # the pending batch and the loader after the round's prompts: an exact resume
    assert [b["step"] for b in unpack(state["batches"])] == [3]
    assert state["loader"] == ctl.loader.state_dict()
