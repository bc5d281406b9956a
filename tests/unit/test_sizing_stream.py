"""Stream mode of the pipeline simulator (orchestrator.sizing.stream_sim: fully asynchronous training with
partial rollouts and k-step staleness) and the sizer's choice of k: hand-computed step times, the staleness
bound, the schedule's resource exclusivity, the k search and its wording, per-step generate variation from
measured rows, and the errors."""
import random

import pytest

from orchestrator.sizing.measurements import fit_workload, generate_variation, measure_rows
from orchestrator.sizing.recommend import config_keys, format_sizing
from orchestrator.sizing.scaling import Law, constant
from orchestrator.sizing.simulator import StepCosts, simulate
from orchestrator.sizing.sizer import proxy_step_s, size
from orchestrator.sizing.stream_sim import build_stream_schedule, choose_k, overlap_limit_s, simulate_stream
from orchestrator.sizing.workload import SizingError, Split, Workload, evaluate


def _random_costs(rng: random.Random) -> StepCosts:
    sync = rng.uniform(0, 3)
    return StepCosts(generate_s=rng.uniform(0.1, 10), train_s=rng.uniform(0.1, 10), sync_s=sync,
                     reward_s=rng.uniform(0, 3), reference_s=rng.uniform(0, 3), checkpoint_s=rng.uniform(0, 1),
                     critic_s=rng.choice([0.0, rng.uniform(0, 5)]), recompute_s=rng.choice([0.0, rng.uniform(0, 1)]),
                     sync_hidden_s=rng.choice([0.0, rng.uniform(0, sync)]))


@pytest.mark.parametrize("gen,train,k", [(10, 6, 1), (6, 10, 1), (8, 8, 1), (10, 6, 3), (6, 10, 4)])
def test_constant_costs_reach_the_overlap_limit_with_any_k(gen, train, k):
    """Rollout: generate + its pause for the sync per step; trainer: train + sync. The period is the larger,
    max(gen, train) + sync, for every k >= 1: (gen + train + sync) / 2 never exceeds it."""
    c = StepCosts(generate_s=gen, train_s=train, sync_s=1)
    r = simulate("stream", c, staleness=k)
    assert r.step_s == pytest.approx(max(gen, train) + 1)
    assert r.step_s == pytest.approx(overlap_limit_s(c))
    busiest = "rollout" if gen > train else "trainer"
    assert r.busy[busiest] == pytest.approx(1.0)
    assert r.phase_share("sync") == pytest.approx(1 / r.step_s)


def test_reference_checkpoint_and_critic_on_the_trainer_side():
    # the trainer runs reference 2 + train 6 + sync 1 + checkpoint 0.5 = 9.5 s per step; rollout 5 + 1
    c = StepCosts(generate_s=5, train_s=6, sync_s=1, reference_s=2, checkpoint_s=0.5)
    assert simulate_stream(c, 1, "trainer").step_s == pytest.approx(9.5)
    assert simulate_stream(c, 1, "own").step_s == pytest.approx(6 + 1 + 0.5)  # the reference beside it
    # a 12 s critic on its own device beside the policy update: the sync waits for it, and the critic's next
    # update (its batch already generated) overlaps that sync: critic-bound, 12 s
    critic = StepCosts(generate_s=5, train_s=6, sync_s=1, critic_s=12)
    assert simulate_stream(critic, 2).step_s == pytest.approx(12) == overlap_limit_s(critic)


def test_a_slow_reward_chain_needs_a_larger_k():
    """generate 10 -> reward 5 -> train 10 -> sync 1 is a 26 s chain; batch j may start when sync_{j-k-1}
    ended, so the chain spreads over k + 1 steps: max(26 / 2, 11) = 13 s at k = 1, 11 s from k = 2."""
    c = StepCosts(generate_s=10, train_s=10, sync_s=1, reward_s=5)
    assert simulate_stream(c, 1).step_s == pytest.approx(13.0)
    assert simulate_stream(c, 2).step_s == pytest.approx(11.0)
    r = choose_k(c)
    assert r.k == 2 and r.step_by_k[1] == pytest.approx(13.0)


def test_variable_generation_is_absorbed_by_a_larger_k():
    """Generation alternates 2 s and 18 s (mean 10), train 10, sync 1: the overlap limit is 11 s. With k = 1
    the slow batch stalls the trainer; with k = 2 the batch generated ahead covers it."""
    c, scale = StepCosts(generate_s=10, train_s=10, sync_s=1), (0.2, 1.8)
    assert overlap_limit_s(c, None, scale) == pytest.approx(11.0)
    one, two = (simulate_stream(c, k, generate_scale=scale).step_s for k in (1, 2))
    assert one > 11.0 * 1.1
    assert two == pytest.approx(11.0)
    # whole-generation modes pay the variation in full: synchronous = mean gen + train + sync
    assert simulate("disaggregated", c, generate_scale=scale).step_s == pytest.approx(21.0)
    assert simulate("async", c, staleness=2, generate_scale=scale).step_s > two


def test_larger_k_is_never_slower():
    """Raising k only loosens the capacity rule (gen_j waits for sync_{j-k-1}). With interruptions the
    schedule may repeat every few steps, which the finite window averages to within ~0.5% (phases.window_steps)."""
    rng = random.Random(7)
    for _ in range(120):
        c = _random_costs(rng)
        c = StepCosts(**{**c.__dict__, "recompute_s": 0.0})  # a recompute can make a fuller pipeline pay more
        scale = tuple(rng.uniform(0.2, 2) for _ in range(rng.randint(0, 5)))
        ref = rng.choice([None, "own", "trainer"])
        steps = [simulate_stream(c, k, ref, None, scale).step_s for k in (1, 2, 3)]
        assert all(b <= a * 1.01 for a, b in zip(steps, steps[1:])), (c, scale, steps)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_staleness_never_exceeds_k(k):
    rng = random.Random(k)
    for _ in range(100):
        scale = tuple(rng.uniform(0.1, 3) for _ in range(rng.randint(0, 6)))
        r = simulate_stream(_random_costs(rng), k, rng.choice([None, "own", "trainer"]), None, scale)
        assert r.max_staleness <= k
        assert all(p.step - 1 - p.weight_version <= k for p in r.phases if p.name.startswith("generate_"))
    # engines 10x faster than the trainer run k + 1 batches ahead: the bound is reached, not just respected
    assert simulate_stream(StepCosts(generate_s=1, train_s=10, sync_s=1), k).max_staleness == k


def test_a_sync_interrupts_generation_and_the_recompute_is_paid():
    """Rollout-bound (gen 10 > train 6): every sync lands inside a generation, which continues on the new
    weights after the 1 s pause and the 0.5 s re-prefill: the period is 10 + 1 + 0.5."""
    c = StepCosts(generate_s=10, train_s=6, sync_s=1, recompute_s=0.5)
    r = simulate_stream(c, 1)
    assert r.step_s == pytest.approx(11.5)
    assert r.phase_share("recompute") == pytest.approx(0.5 / 11.5)
    pieces = [p for p in r.phases if p.name == "generate_5"]
    assert len(pieces) == 2 and pieces[1].weight_version == pieces[0].weight_version + 1
    assert sum(p.duration for p in pieces) == pytest.approx(10.0)
    # train-bound: the engines idle when the sync lands, nothing to re-prefill
    assert simulate_stream(StepCosts(generate_s=6, train_s=10, sync_s=1, recompute_s=0.5), 1).step_s \
        == pytest.approx(11.0)


def test_no_resource_runs_two_phases_at_once():
    rng = random.Random(3)
    for _ in range(30):
        k = rng.randint(1, 4)
        timed = build_stream_schedule(_random_costs(rng), 12, k, rng.choice([None, "own", "trainer"]),
                                      tuple(rng.uniform(0.2, 2) for _ in range(3)))
        by_res: dict[str, list] = {}
        for p in timed:
            for res in p.resources:
                by_res.setdefault(res, []).append((p.start, p.end))
        for spans in by_res.values():
            spans.sort()
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
        assert len([p for p in timed if p.name.startswith("train_")]) == 12


def test_choose_k_picks_the_smallest_k_within_the_tolerance():
    c = StepCosts(generate_s=10, train_s=10, sync_s=1)
    flat = choose_k(c, max_k=4)
    assert flat.k == 1 and flat.step_by_k == {1: pytest.approx(11.0)}  # at the overlap limit: search stops
    r = choose_k(c, max_k=4, generate_scale=(0.3, 0.3, 2.4))  # one slow batch in three: 3 ahead to cover it
    best = min(r.step_by_k.values())
    assert best == pytest.approx(11.0) and r.step_s <= best * 1.02
    assert all(r.step_by_k[k] > best * 1.02 for k in range(1, r.k))
    assert r.k > 1 and r.max_staleness <= r.k
    loose = choose_k(c, max_k=4, tolerance=0.5, generate_scale=(0.3, 0.3, 2.4))
    assert loose.k < r.k and loose.step_s <= best * 1.5


def _workload(**kw) -> Workload:
    return Workload(Law(2, 64, 1), Law(0, 80, 0.8), Law(3, 0.25, -1), reward_s=0.5, checkpoint_s=0.2, **kw)


def test_sizer_recommends_stream_with_its_k_and_config_keys():
    w = _workload()
    s = size(w, 64, ("stream",))
    text = format_sizing(s, w, ("stream",))
    assert s.best.result.k == 1
    assert "fully asynchronous, partial rollouts" in text and ", k = 1" in text
    assert "config: placement.mode=disaggregated rollout.mode=stream algo.max_staleness=1" in text
    assert "k = 1 already reaches the overlap limit" in text
    varied = _workload(generate_scale=(0.3, 0.3, 2.4))
    b = size(varied, 64, ("stream",)).best
    assert b.result.k > 1 and b.step_s < b.result.step_by_k[1]
    text = format_sizing(size(varied, 64, ("stream",)), varied, ("stream",))
    assert f"algo.max_staleness={b.result.k}" in text and "varies from step to step" in text
    assert "k = 1 would take" in text
    assert config_keys(size(w, 64, ("async",)).best, w) == "placement.mode=disaggregated rollout.mode=one_step_off algo.max_staleness=1"


def test_stream_is_never_slower_than_one_step_off_async():
    """Whole-generation async syncs between generations, so the trainer waits for the one in flight; stream
    never waits (no recompute cost given), so its best split is at least as fast."""
    for w in (_workload(), _workload(generate_scale=(0.5, 1.5, 1.0))):
        assert size(w, 64, ("stream",)).best.step_s <= size(w, 64, ("async",)).best.step_s * 1.005


def test_measured_rows_give_the_per_step_variation():
    rows = [{"timing/generate_s": g, "timing/train_s": 5.0} for g in (30.0, 4.0, 8.0, 4.0, 12.0)]
    run = measure_rows(rows, {"rollout": 1, "trainer": 1, "reference": 0}, "run", "test", {})
    assert run.generate_steps == [4.0, 8.0, 4.0, 12.0]  # the warm-up dropped
    assert generate_variation([run]) == pytest.approx((4 / 6, 8 / 6, 4 / 6, 12 / 6))  # over the median, 6 s
    w, notes = fit_workload([run])
    assert w.generate_scale == pytest.approx((4 / 6, 8 / 6, 4 / 6, 12 / 6))
    assert any("varies from step to step" in n for n in notes)
    assert fit_workload([run], variation=False)[0].generate_scale == ()
    flat = [{"timing/generate_s": 5.0, "timing/train_s": 5.0}] * 4
    assert generate_variation([measure_rows(flat, {"rollout": 1, "trainer": 1, "reference": 0}, "r", "t", {})]) == ()


def test_stream_rows_are_measured_by_the_engines_busy_seconds():
    """A stream run's timing/generate_s is the trainer's wait for a ready batch; its generation cost is the
    engines' busy seconds per step (rollout/worker_generate_s_mean)."""
    rows = [{"timing/generate_s": 0.1, "timing/train_s": 5.0, "async/buffer_groups": 2.0,
             "rollout/worker_generate_s_mean": g} for g in (9.0, 3.0, 4.0, 5.0)]
    run = measure_rows(rows, {"rollout": 1, "trainer": 1, "reference": 0}, "run", "test", {})
    assert run.phases["generate"] == pytest.approx(4.0) and run.generate_steps == [3.0, 4.0, 5.0]


def test_an_overlapped_sync_is_measured_whole_not_by_the_send_the_step_waited_for():
    """weight_sync.overlap: timing/weight_sync_s is the trainer's send; the sync's cost is sync/seconds."""
    rows = [{"timing/generate_s": 0.1, "timing/train_s": 5.0, "timing/weight_sync_s": 0.2, "sync/overlapped": 1.0,
             "sync/seconds": s} for s in (3.0, 1.0, 1.2, 1.4)]
    rows.append({"timing/generate_s": 0.1, "timing/train_s": 5.0, "timing/weight_sync_s": 1.3})  # a synchronous sync
    run = measure_rows(rows, {"rollout": 1, "trainer": 1, "reference": 0}, "run", "test", {})
    assert run.phases["sync"] == pytest.approx(1.25)  # median of 1.0, 1.2, 1.4, 1.3


def test_an_overlapped_sync_holds_the_trainer_for_its_send_and_the_engines_for_the_rest():
    """weight_sync.overlap: the trainer sends (0.3 s) and trains on; the engines generate during the send and pause
    for the rest of the 2 s sync (1.7 s: load, checks, probe). Train-bound (12 > 10): the period drops from
    train + sync = 14 to train + send = 12.3, and the trainer's busy time holds no hidden part; rollout-bound
    (gen 13): generate + the engines' part = 14.7 (a synchronous sync: generate + sync = 15)."""
    whole, hidden = StepCosts(generate_s=10, train_s=12, sync_s=2), StepCosts(generate_s=10, train_s=12, sync_s=2,
                                                                              sync_hidden_s=1.7)
    assert simulate_stream(whole, 1).step_s == pytest.approx(14.0)
    r = simulate_stream(hidden, 1)
    assert r.step_s == pytest.approx(12.3) == pytest.approx(overlap_limit_s(hidden))
    trainer = [p for p in r.phases if "trainer" in p.resources and p.step in (6, 7)]  # two steady steps
    assert sorted(p.name for p in trainer) == ["checkpoint_6", "checkpoint_7", "send_6", "send_7", "train_6", "train_7"]
    assert sum(p.duration for p in trainer) == pytest.approx(2 * 12.3)  # busy the whole period: train + send
    assert r.busy["rollout"] == pytest.approx(11.7 / 12.3)  # 10 s generating + the 1.7 s the engines were held
    assert proxy_step_s("stream", hidden, 1, None) == pytest.approx(12.3)
    assert proxy_step_s("async", whole, 1, None) == pytest.approx(14.0)
    slow_gen = StepCosts(generate_s=13, train_s=12, sync_s=2, sync_hidden_s=1.7)
    assert simulate_stream(slow_gen, 2).step_s == pytest.approx(14.7) == pytest.approx(overlap_limit_s(slow_gen))
    assert overlap_limit_s(StepCosts(generate_s=13, train_s=12, sync_s=2)) == pytest.approx(15.0)
    assert proxy_step_s("stream", slow_gen, 2, None) == pytest.approx(14.7)
    syncs = sorted((p.start, p.end) for p in r.phases if p.name.startswith("sync_"))
    assert all(a[1] <= b[0] + 1e-9 for a, b in zip(syncs, syncs[1:]))  # one sync in flight at a time
    with pytest.raises(ValueError, match="StepCosts.sync_hidden_s: must be at most sync_s=1"):
        StepCosts(generate_s=1, train_s=1, sync_s=1, sync_hidden_s=1.5)


def test_overlapped_rows_give_the_hidden_fraction_and_stream_costs_use_it():
    """Each sync's send (row of its sync/version) pairs with its whole time (row of its sync/verified_version)."""
    rows = [{"timing/generate_s": 0.1, "timing/train_s": 5.0, "timing/weight_sync_s": 0.2, "sync/version": v,
             "sync/send_s": 0.2} for v in range(1, 6)]
    for v, whole in ((1, 1.0), (2, 2.0), (3, 0.8), (4, 1.0)):  # settled at the next step's start
        rows[v].update({"sync/overlapped": 1.0, "sync/verified_version": v, "sync/seconds": whole})
    run = measure_rows(rows, {"rollout": 1, "trainer": 1, "reference": 0}, "run", "test", {})
    assert run.sync_hidden_frac == pytest.approx(0.8)  # median of 0.8, 0.9, 0.75, 0.8
    workload, notes = fit_workload([run])
    assert workload.sync_hidden_frac == pytest.approx(0.8)
    assert any("80% of it hidden behind training in stream mode" in n for n in notes)
    sync = workload.sync(1)
    assert workload.costs(Split("stream", 1, 1)).sync_hidden_s == pytest.approx(0.8 * sync)
    assert workload.costs(Split("async", 1, 1)).sync_hidden_s == 0.0  # only streaming runs overlap their syncs
    plain = measure_rows([{k: v for k, v in r.items() if not k.startswith("sync/")} for r in rows],
                         {"rollout": 1, "trainer": 1, "reference": 0}, "run", "test", {})
    assert plain.sync_hidden_frac is None
    workload, notes = fit_workload([plain])
    assert workload.sync_hidden_frac == 0.0 and any("no overlapped sync measured" in n for n in notes)
    with pytest.raises(SizingError, match="sync_hidden_frac: must be at most 1"):
        _workload(sync_hidden_frac=1.5)


def test_evaluate_uses_the_workload_k_search_and_recompute():
    w = Workload(constant(10.0), constant(6.0), constant(1.0), recompute_s=0.5, max_k=2)
    r = evaluate(w, Split("stream", 1, 1))
    assert r.step_s == pytest.approx(11.5) and set(r.step_by_k) == {1, 2}
    assert evaluate(w, Split("async", 1, 1)).step_s == pytest.approx(11.0)  # no recompute outside stream


def test_bad_input_raises_naming_it():
    c = StepCosts(generate_s=1, train_s=1)
    with pytest.raises(ValueError, match=r"k \(algo.max_staleness\)"):
        simulate("stream", c, staleness=0)
    with pytest.raises(ValueError, match=r"k \(algo.max_staleness\)"):
        build_stream_schedule(c, 4, k=-1)
    with pytest.raises(ValueError, match="max_k"):
        choose_k(c, max_k=0)
    with pytest.raises(ValueError, match="tolerance"):
        choose_k(c, tolerance=-0.1)
    with pytest.raises(ValueError, match="generate_scale"):
        simulate("stream", c, staleness=1, generate_scale=(1.0, 0.0))
    with pytest.raises(ValueError, match="generate_scale"):
        simulate("async", c, generate_scale=(float("nan"),))
    with pytest.raises(ValueError, match="StepCosts.recompute_s"):
        StepCosts(generate_s=1, train_s=1, recompute_s=-1)
    with pytest.raises(SizingError, match="max_k"):
        _workload(max_k=0)
    with pytest.raises(SizingError, match="k_tolerance"):
        _workload(k_tolerance=-1)
    with pytest.raises(SizingError, match="generate_scale"):
        _workload(generate_scale=(-1.0,))
