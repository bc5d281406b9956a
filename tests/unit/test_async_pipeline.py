"""The async pipeline's schedule (orchestrator/rollout/async_pipeline.py), simulated with random phase durations.

The simulator is an event timeline of one controller and engines that run their calls in order: it
records, independently of the pipeline, which weight version the engines held when each generation
started, and checks the pipeline's tickets, staleness bound, drops and the time hidden by overlap.
"""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from orchestrator.rollout.async_pipeline import AsyncPipeline
from orchestrator.config import load_config
from orchestrator.config.load import ConfigError


def simulate(max_staleness: int, total: int, gen, train, sync_s: float = 0.05, depth=None) -> dict:
    """Run `total` steps; gen(step) / train(step) give seconds. Returns per-step records and totals."""
    pipe = AsyncPipeline(max_staleness, total, depth=depth)
    clock, engine_free, engine_version, policy = 0.0, 0.0, 0, 0
    done, actual_version, launched, records = {}, {}, [], []

    def run_generation(step):
        nonlocal engine_free
        start = max(clock, engine_free)  # the engines run one call at a time, in order
        actual_version[step] = engine_version  # what the engines hold when the generation starts
        engine_free = done[step] = start + gen(step)

    for step in range(1, total + 1):
        for ticket in pipe.to_launch(step):
            launched.append(ticket.step)
            run_generation(ticket.step)
            assert ticket.weight_version == actual_version[ticket.step]
        clock = max(clock, done[step])
        pipe.arrived(step)
        adm = pipe.admit(step, policy)
        if not adm.admitted:
            ticket = pipe.regenerate(step)
            run_generation(step)
            assert ticket.weight_version == actual_version[step]
            clock = max(clock, done[step])
            pipe.arrived(step)
            adm = pipe.admit(step, policy)
        assert adm.admitted and adm.weight_version == actual_version[step]
        assert adm.staleness == policy - actual_version[step] <= max_staleness
        records.append(pipe.metrics(adm))
        clock += train(step)
        for s in list(pipe.running):  # wait for running generations before the sync
            clock = max(clock, done[s])
            pipe.arrived(s)
        clock = max(clock, engine_free) + sync_s
        engine_free, engine_version, policy = clock, step, step
        pipe.synced(step)
    return {"records": records, "launched": launched, "time": clock, "dropped": pipe.dropped}


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
@pytest.mark.parametrize("seed", range(20))
def test_staleness_never_exceeds_the_bound_for_random_durations(max_staleness, seed):
    rng = random.Random(seed)
    total = rng.randint(1, 12)
    gens = {s: rng.uniform(0.01, 3.0) for s in range(1, total + 1)}
    trains = {s: rng.uniform(0.01, 3.0) for s in range(1, total + 1)}
    for depth in range(max_staleness + 1):
        out = simulate(max_staleness, total, gens.__getitem__, trains.__getitem__, depth=depth)
        stale = [r["async/staleness"] for r in out["records"]]
        # batch j is launched at step j - depth on weights j - depth - 1 (never before step 1)
        assert stale == [min(j - 1, depth) for j in range(1, total + 1)]
        assert out["dropped"] == 0
        assert sorted(out["launched"]) == list(range(1, total + 1))  # each batch once, none past the last step
        assert out["records"][-1]["async/max_staleness_seen"] == max(stale) <= max_staleness


def test_one_step_off_has_staleness_one_after_the_first_step_and_hides_generation():
    gen, train = (lambda s: 2.0), (lambda s: 3.0)
    sync = simulate(0, 5, gen, train, sync_s=0.5)
    off = simulate(1, 5, gen, train, sync_s=0.5)
    assert [r["async/staleness"] for r in off["records"]] == [0, 1, 1, 1, 1]
    # synchronous: 5 x (2 + 3 + 0.5) = 27.5 s; one step off: generation 1 exposed (2 s), then every
    # step trains (3) and syncs (0.5) while the next batch's 2 s hide behind the training: 2 + 5 x 3.5
    assert sync["time"] == pytest.approx(27.5)
    assert off["time"] == pytest.approx(19.5)


def test_max_staleness_zero_is_the_synchronous_order():
    pipe = AsyncPipeline(0, 3)
    events = []
    for step in (1, 2, 3):
        events += [("launch", t.step, t.weight_version) for t in pipe.to_launch(step)]
        pipe.arrived(step)
        adm = pipe.admit(step, step - 1)
        events.append(("train", step, adm.staleness))
        pipe.synced(step)
    assert events == [("launch", 1, 0), ("train", 1, 0), ("launch", 2, 1), ("train", 2, 0),
                      ("launch", 3, 2), ("train", 3, 0)]


def test_a_batch_over_the_bound_is_dropped_counted_and_regenerated():
    # a lookahead of 2 with a bound of 1: batch j (j >= 3) is two versions old -> dropped, regenerated fresh
    out = simulate(1, 6, lambda s: 1.0, lambda s: 1.0, depth=2)
    stale = [r["async/staleness"] for r in out["records"]]
    assert stale == [0, 1, 0, 0, 0, 0]
    assert [r["async/dropped_batches"] for r in out["records"]] == [0, 0, 1, 2, 3, 4]
    assert out["dropped"] == 4


def test_admission_arithmetic_and_guards():
    pipe = AsyncPipeline(1, 10)
    assert [(t.step, t.weight_version) for t in pipe.to_launch(1)] == [(1, 0), (2, 0)]
    with pytest.raises(ValueError, match="running"):
        pipe.synced(1)  # batch 1 and 2 still generating
    pipe.arrived(1)
    pipe.arrived(2)
    assert pipe.admit(1, 0).staleness == 0
    pipe.synced(1)
    adm = pipe.admit(2, 1)
    assert (adm.staleness, adm.admitted, adm.weight_version) == (1, True, 0)
    with pytest.raises(KeyError, match="step 2"):
        pipe.admit(2, 1)
    with pytest.raises(ValueError, match="older"):
        pipe.synced(0)
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncPipeline(-1, 3)
    with pytest.raises(ValueError, match="start_step"):
        AsyncPipeline(1, 3, start_step=4)


def test_last_step_launches_nothing_beyond_total_steps_and_resume_starts_fresh():
    pipe = AsyncPipeline(1, 3, start_step=2)  # resumed after step 2: nothing in flight, engines at version 2
    assert [(t.step, t.weight_version) for t in pipe.to_launch(3)] == [(3, 2)]
    pipe.arrived(3)
    assert pipe.admit(3, 2).staleness == 0
    assert pipe.next_step == 4 and not pipe.in_flight
    full = AsyncPipeline(1, 3)
    for step in (1, 2, 3):
        launched = [t.step for t in full.to_launch(step)]
        assert launched == ([1, 2] if step == 1 else [3] if step == 2 else [])  # nothing past step 3
        for s in list(full.running):
            full.arrived(s)
        full.admit(step, step - 1)
        full.synced(step)


def test_discard_relaunches_the_discarded_steps():
    pipe = AsyncPipeline(1, 5)
    pipe.to_launch(1)
    pipe.arrived(1)
    pipe.admit(1, 0)
    assert pipe.discard() == [2]  # engines re-placed while batch 2 was generating
    assert pipe.dropped == 1 and not pipe.running
    pipe.synced(1)
    assert [(t.step, t.weight_version) for t in pipe.to_launch(2)] == [(2, 1), (3, 1)]


def test_the_pipeline_module_imports_no_ray():
    code = ("import sys, orchestrator.rollout.async_pipeline\n"
            "print(','.join(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'actors', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


@pytest.mark.parametrize("extra, match", [
    (["algo.tis_cap=null"], "algo.tis_cap"),
])
def test_config_refuses_async_combinations_it_cannot_run(extra, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["rollout.mode=one_step_off", *extra])


def test_config_accepts_async_multi_turn():  # the async pipeline wraps any rollout source
    cfg = load_config("configs/grpo_guessing_cpu.yaml", ["rollout.mode=one_step_off", "algo.tis_cap=2.0"])
    assert cfg.rollout.mode == "one_step_off" and cfg.placement.mode == "disaggregated" and cfg.env.name


def test_config_accepts_async_with_rollout_old_logprobs_or_bound_zero():
    for extra in (["algo.old_logprobs=rollout", "algo.tis_cap=null"], ["algo.max_staleness=0", "algo.tis_cap=null"]):
        cfg = load_config(None, ["rollout.mode=one_step_off", *extra])
        assert cfg.rollout.mode == "one_step_off"


def test_a_restored_batch_is_in_flight_and_the_next_launch_follows_it():
    from orchestrator.rollout.async_pipeline import Ticket

    pipe = AsyncPipeline(max_staleness=1, total_steps=6, start_step=3)
    pipe.restore(Ticket(4, 2))  # batch 4, generated by weights 2 before the checkpoint of step 3
    assert [t.step for t in pipe.to_launch(4)] == [5]  # launched on the engines' version 3
    adm = pipe.admit(4, 3)
    assert adm.admitted and adm.staleness == 1 and adm.weight_version == 2
    pipe.load_counters({"dropped": 2, "max_staleness_seen": 1})
    assert pipe.counters() == {"dropped": 2, "max_staleness_seen": 1}
    for bad in (Ticket(3, 2), Ticket(7, 5)):  # already trained, or past trainer.total_steps
        with pytest.raises(ValueError, match="restored batch"):
            AsyncPipeline(1, 6, start_step=3).restore(bad)
