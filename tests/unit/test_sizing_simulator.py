"""Pipeline simulator (orchestrator.sizing.simulator): hand-computed step times, busy fractions and the
async staleness bound."""
import random

import pytest

from orchestrator.sizing.simulator import StepCosts, build_schedule, simulate
from orchestrator.sizing.sizer import proxy_step_s


def test_disaggregated_sync_step_is_the_sum_without_overlap():
    r = simulate("disaggregated", StepCosts(generate_s=10, train_s=6, sync_s=1))
    assert r.step_s == pytest.approx(17.0)  # gen + train + sync
    assert r.busy["rollout"] == pytest.approx(11 / 17)  # generate + its side of the sync
    assert r.busy["trainer"] == pytest.approx(7 / 17)
    assert r.max_staleness == 0


@pytest.mark.parametrize("gen,train,expected", [(10, 6, 11), (6, 10, 11), (8, 8, 9)])
def test_async_staleness_1_overlaps_generate_and_train(gen, train, expected):
    """One step off-policy: period = max(gen, train) + sync, since the sync holds both sides (the
    engines load the new weights between two generations), as long as the chain
    gen + train + sync spread over 2 steps is shorter."""
    r = simulate("async", StepCosts(generate_s=gen, train_s=train, sync_s=1), staleness=1)
    assert r.step_s == pytest.approx(expected)
    assert r.max_staleness == 1
    busiest = "rollout" if gen > train else "trainer"
    assert r.busy[busiest] == pytest.approx(1.0)


def test_async_chain_bound_with_a_slow_reward():
    """gen 10 -> reward 5 -> train 10 -> sync 1 is one chain of 26 s; generate_{k+2} waits for sync_k,
    so with staleness s the period is max(26 / (s + 1), gen + sync, train + sync)."""
    c = StepCosts(generate_s=10, train_s=10, sync_s=1, reward_s=5)
    assert simulate("async", c, staleness=1).step_s == pytest.approx(13.0)
    assert simulate("async", c, staleness=2).step_s == pytest.approx(11.0)
    assert simulate("disaggregated", c).step_s == pytest.approx(26.0)


def test_colocated_is_the_sum_of_phases_plus_switches():
    c = StepCosts(generate_s=6, train_s=10, sync_s=1, reward_s=2, reference_s=3, checkpoint_s=0.5, switch_s=4)
    r = simulate("colocated", c, reference="trainer")
    # generate, then the switch (2) and the reference (3) on the GPUs while the CPU scores (2), then
    # train, sync, switch back (2), checkpoint
    assert r.step_s == pytest.approx(6 + max(2 + 3, 2) + 10 + 1 + 2 + 0.5)
    assert r.busy["gpus"] == pytest.approx(1.0)
    assert r.phase_share("generate") == pytest.approx(6 / 24.5)
    assert simulate("colocated", StepCosts(generate_s=5, train_s=7, sync_s=2, reward_s=1, switch_s=3)).step_s \
        == pytest.approx(5 + 1.5 + 7 + 2 + 1.5)  # the 1 s reward hides behind the 1.5 s switch


def test_reference_on_own_gpus_overlaps_reward_and_on_trainer_waits_for_checkpoint():
    c = StepCosts(generate_s=6, train_s=10, sync_s=1, reward_s=2, reference_s=3, checkpoint_s=0.5)
    assert simulate("disaggregated", c, reference="own").step_s == pytest.approx(6 + 3 + 10 + 1)
    assert simulate("disaggregated", c, reference="trainer").step_s == pytest.approx(6 + 3 + 10 + 1)
    assert simulate("async", c, reference="own").step_s == pytest.approx(10 + 1 + 0.5)  # trainer-bound
    assert simulate("async", c, reference="trainer").step_s == pytest.approx(3 + 10 + 1 + 0.5)
    slow_ckpt = StepCosts(generate_s=2, train_s=4, sync_s=1, reference_s=3, checkpoint_s=5)
    # reference_{k+1} on the trainer starts after checkpoint_k (5 s after the sync), not after generate (2 s)
    assert simulate("disaggregated", slow_ckpt, reference="trainer").step_s == pytest.approx(5 + 3 + 4 + 1)


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_async_never_exceeds_the_staleness_bound(staleness):
    rng = random.Random(staleness)
    for _ in range(200):
        c = StepCosts(generate_s=rng.uniform(0.1, 10), train_s=rng.uniform(0.1, 10), sync_s=rng.uniform(0, 3),
                      reward_s=rng.uniform(0, 3), reference_s=rng.uniform(0, 3), checkpoint_s=rng.uniform(0, 1))
        r = simulate("async", c, staleness=staleness, reference=rng.choice([None, "own", "trainer"]))
        assert r.max_staleness <= staleness
        for p in r.phases:
            if p.name.startswith("generate_"):
                assert p.step - 1 - p.weight_version <= staleness
    sync = simulate("disaggregated", StepCosts(generate_s=3, train_s=2, sync_s=1))
    assert all(p.weight_version == p.step - 1 for p in sync.phases if p.name.startswith("generate_"))


def test_no_resource_runs_two_phases_at_once():
    c = StepCosts(generate_s=4, train_s=5, sync_s=1, reward_s=1, reference_s=2, checkpoint_s=1)
    for mode in ("colocated", "disaggregated", "async"):
        timed = build_schedule(mode, c, steps=6, staleness=2, reference="own")
        assert len([p for p in timed if p.name.startswith("train_")]) == 6
        by_res = {}
        for p in timed:
            assert p.start >= max((q.end for q in timed if q.name in p.deps), default=0.0) - 1e-9
            for res in p.resources:
                by_res.setdefault(res, []).append((p.start, p.end))
        for spans in by_res.values():
            spans.sort()
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))


def test_proxy_is_exact_for_synchronous_modes():
    rng = random.Random(0)
    for _ in range(300):
        c = StepCosts(*[rng.choice([0.0, rng.uniform(0, 10)]) for _ in range(7)])
        for mode in ("colocated", "disaggregated"):
            for ref in (None, "own", "trainer"):
                assert proxy_step_s(mode, c, 1, ref) == pytest.approx(simulate(mode, c, 1, ref).step_s)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="mode"):
        simulate("pipelined", StepCosts(1, 1))
    with pytest.raises(ValueError, match="reference"):
        simulate("async", StepCosts(1, 1), reference="gpu")
    with pytest.raises(ValueError, match="StepCosts.train_s"):
        StepCosts(generate_s=1, train_s=-1)
