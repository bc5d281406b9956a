"""Controller-side guards (orchestrator/guards): skipped updates counted over the run and
run.max_skipped_updates in a row stopping it with a clear message; the optional health guards (reward
collapse, responses pinned at the length limit, KL and grad-norm spikes)."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from orchestrator.config import load_config
from orchestrator.guards import DivergedError, GuardTripped, HealthGuards, RunGuards, SkippedUpdates
from orchestrator.guards.signals import in_a_row, is_spike


def _row(skipped=0.0, trailing=None, why="loss", **extra):
    row = {"actor/skipped_updates": skipped, "actor/skipped_trailing": skipped if trailing is None else trailing,
           "actor/nonfinite_loss": 0.0, "actor/nonfinite_grad_norm": 0.0, "actor/nonfinite_weights": 0.0}
    if skipped:
        row[f"actor/nonfinite_{why}"] = skipped
    row.update(extra)
    return row


def test_skipped_updates_are_counted_and_a_good_update_restarts_the_count():
    s = SkippedUpdates(3)
    assert s.observe(1, _row()) == {"actor/skipped_updates_total": 0.0, "actor/skipped_in_a_row": 0.0}
    assert s.observe(2, _row(1.0)) == {"actor/skipped_updates_total": 1.0, "actor/skipped_in_a_row": 1.0}
    assert s.observe(3, _row(1.0, why="grad_norm"))["actor/skipped_in_a_row"] == 2.0
    assert s.observe(4, _row()) == {"actor/skipped_updates_total": 2.0, "actor/skipped_in_a_row": 0.0}
    assert s.observe(5, {"step": 5}) == {}  # a step that did not train counts nothing


def test_max_skipped_updates_in_a_row_stop_the_run_naming_what_when_and_what_to_do():
    s = SkippedUpdates(3, lr=2e-5)
    s.observe(1, _row())
    s.observe(2, _row(1.0))
    s.observe(3, _row(1.0, why="grad_norm"))
    with pytest.raises(DivergedError) as e:
        s.observe(4, _row(1.0, why="weights"))
    msg = str(e.value)
    assert "run.max_skipped_updates=3: 3 optimizer updates in a row were skipped" in msg
    assert "step 2: non-finite loss; step 3: non-finite grad_norm; step 4: non-finite weights" in msg
    assert "before step 2" in msg and "lower trainer.lr (now 2e-05)" in msg
    assert "checkpoint.resume=latest" in msg and "reward/*" in msg


def test_zero_never_stops_and_mini_batches_count_updates():
    never = SkippedUpdates(0)
    for step in range(1, 20):
        never.observe(step, _row(1.0))
    assert never.total == 19
    s = SkippedUpdates(3, updates_per_step=2)  # two optimizer updates per step
    assert s.observe(1, _row(1.0, trailing=1.0))["actor/skipped_in_a_row"] == 1.0  # the 2nd update skipped
    with pytest.raises(DivergedError, match="3 optimizer updates in a row"):
        s.observe(2, _row(2.0))  # both skipped: 1 + 2 in a row
    t = SkippedUpdates(3, updates_per_step=2)
    t.observe(1, _row(2.0))
    assert t.observe(2, _row(1.0, trailing=0.0))["actor/skipped_in_a_row"] == 0.0  # the 2nd update applied


def _guards(**over):
    g = dict(action="warn", reward_collapse_steps=0, truncated_steps=0, truncated_frac=0.9, kl_spike_factor=0.0,
             grad_norm_spike_factor=0.0, spike_window=20, spike_min_steps=3, entropy_collapse_steps=0,
             entropy_floor=0.01, update_ratio_max=0.0)
    g.update(over)
    return HealthGuards(SimpleNamespace(**g))


def test_guards_are_off_by_default_and_add_nothing():
    assert _guards().observe(1, {"reward/std": 0.0, "rollout/truncated_frac": 1.0, "actor/grad_norm": 1e9,
                                 "actor/entropy": 0.0}) == {}
    assert _guards(entropy_collapse_steps=1, entropy_floor=0.0).observe(1, {"actor/entropy": 0.0}) == {}  # floor 0: off


def test_entropy_collapse_trips_after_k_steps_below_the_floor_and_clears(capsys):
    g = _guards(entropy_collapse_steps=2, entropy_floor=0.05)
    flags = [g.observe(s, {"actor/entropy": e})["guard/entropy_collapse"]
             for s, e in enumerate([0.04, 0.3, 0.01, math.nan, 0.02, 0.2], start=1)]
    assert flags == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # a NaN entropy (a skipped step) neither counts nor breaks a streak
    assert ("guard entropy_collapse at step 5: actor/entropy 0.02 nats per token < guards.entropy_floor=0.05 for 2 "
            "steps in a row: the policy samples nearly one answer") in capsys.readouterr().out


def test_update_explosion_trips_at_the_first_update_over_the_limit(capsys):
    g = _guards(update_ratio_max=0.1)
    rows = [{"actor/update_ratio": 1e-4, "actor/lr": 2e-5}, {}, {"actor/update_ratio": 2.7, "actor/lr": 0.5},
            {"actor/update_ratio": math.inf, "actor/lr": 0.5}, {"actor/update_ratio": math.nan}]
    flags = [g.observe(s, row)["guard/update_explosion"] for s, row in enumerate(rows, start=1)]
    assert flags == [0.0, 0.0, 1.0, 1.0, 0.0]  # absent (every update skipped) or NaN: no verdict
    assert ("guard update_explosion at step 3: actor/update_ratio 2.7 > guards.update_ratio_max=0.1: an update moved "
            "the weights by 2.7 of their norm (actor/lr 0.5): the policy diverges; lower trainer.lr"
            ) in capsys.readouterr().out
    assert _guards().observe(1, {"actor/update_ratio": 50.0}) == {}  # 0: off


def test_reward_collapse_trips_after_k_constant_steps_and_clears(capsys):
    g = _guards(reward_collapse_steps=2)
    assert g.observe(1, {"reward/std": 0.0, "reward/mean": 0.0}) == {"guard/reward_collapse": 0.0}
    assert g.observe(2, {"reward/std": 0.0, "reward/mean": 0.0}) == {"guard/reward_collapse": 1.0}
    assert "guard reward_collapse at step 2: every sample got the same reward" in capsys.readouterr().out
    assert g.observe(3, {"reward/std": 0.5}) == {"guard/reward_collapse": 0.0}
    assert g.observe(4, {"reward/std": 0.0}) == {"guard/reward_collapse": 0.0}


def test_length_pinned_trips_when_most_responses_hit_the_limit_k_steps():
    g = _guards(truncated_steps=3, truncated_frac=0.75)
    flags = [g.observe(s, {"rollout/truncated_frac": f})["guard/length_pinned"]
             for s, f in enumerate([0.8, 1.0, 0.5, 0.75, 0.9, 1.0, 1.0], start=1)]
    assert flags == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_grad_norm_spike_against_the_running_median_ignores_non_finite_values():
    g = _guards(grad_norm_spike_factor=5.0)
    norms = [1.0, math.nan, 1.2, 0.8, 4.0, 7.0, math.inf, 1.0]
    flags = [g.observe(s, {"actor/grad_norm": v})["guard/grad_norm_spike"] for s, v in enumerate(norms, start=1)]
    # the window needs 3 finite values (1.0, 1.2, 0.8: median 1.0); 4.0 is below 5x, 7.0 above 5x median(1,1.2,.8,4)
    assert flags == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_kl_spike_and_stop_action():
    g = _guards(kl_spike_factor=3.0, action="stop")
    for s, kl in enumerate([0.01, 0.012, 0.011], start=1):
        assert g.observe(s, {"actor/kl": kl}) == {"guard/kl_spike": 0.0}
    with pytest.raises(GuardTripped, match=r"guard kl_spike at step 4: actor/kl 0.05 > 3 x running median 0.011"):
        g.observe(4, {"actor/kl": 0.05})


def test_helpers():
    assert [in_a_row(2, True), in_a_row(2, False), in_a_row(2, None)] == [3, 0, 2]
    assert is_spike(10.0, [1.0, 1.0], 5.0, 3) is None  # too few values
    assert is_spike(10.0, [0.0, 0.0, 0.0], 5.0, 3) is None  # a zero median: nothing to compare with
    assert is_spike(10.0, [1.0, 2.0, 3.0], 4.0, 3) == "10 > 4 x running median 2"


def test_run_guards_from_a_loaded_config():
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["run.max_skipped_updates=2", "guards.reward_collapse_steps=1"])
    guards = RunGuards(cfg)
    out = guards.after_step(1, {**_row(1.0), "reward/std": 0.0})
    # the guards on by default (length_pinned, entropy_collapse, grad_norm_spike) report 0: their signals are absent
    # or normal here
    assert out == {"actor/skipped_updates_total": 1.0, "actor/skipped_in_a_row": 1.0, "guard/reward_collapse": 1.0,
                   "guard/length_pinned": 0.0, "guard/entropy_collapse": 0.0, "guard/update_explosion": 0.0,
                   "guard/grad_norm_spike": 0.0}
    with pytest.raises(DivergedError, match="run.max_skipped_updates=2"):
        guards.after_step(2, _row(1.0))


def test_rl_orch_run_prints_a_stopped_run_and_exits_1(monkeypatch, capsys):
    import argparse

    import orchestrator.controller as controller_module
    from orchestrator.cli.run import run_cmd

    class Stops:
        def __init__(self, cfg):
            self.cfg = cfg

        def run(self):
            raise DivergedError("run.max_skipped_updates=3: 3 optimizer updates in a row were skipped")

        def shutdown(self):
            self.cfg = None

    monkeypatch.setattr(controller_module, "GRPOController", Stops)
    args = argparse.Namespace(config="configs/grpo_arith_cpu.yaml", overrides=[], force=False)
    assert run_cmd(args) == 1
    assert "run stopped: run.max_skipped_updates=3" in capsys.readouterr().err


def test_a_resumed_runs_guards_trip_where_the_uninterrupted_runs_do():
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["guards.truncated_steps=3", "guards.grad_norm_spike_factor=2",
                                                      "guards.spike_min_steps=2", "run.max_skipped_updates=3"])
    rows = [{"rollout/truncated_frac": 1.0, "actor/grad_norm": g, "actor/skipped_updates": s, "actor/nonfinite_loss": s}
            for g, s in ((1.0, 0.0), (1.0, 1.0), (1.0, 1.0), (5.0, 0.0))]
    whole = RunGuards(cfg)
    expected = [whole.after_step(i + 1, r) for i, r in enumerate(rows)]
    first = RunGuards(cfg)
    for i, r in enumerate(rows[:2]):
        first.after_step(i + 1, r)
    state = json.loads(json.dumps(first.state_dict()))  # through the checkpoint's state.json
    resumed = RunGuards(cfg)
    resumed.load_state_dict(state)
    assert [resumed.after_step(i + 3, r) for i, r in enumerate(rows[2:])] == expected[2:]
    assert expected[2]["guard/length_pinned"] == 1.0 and expected[3]["guard/grad_norm_spike"] == 1.0
    fresh = RunGuards(cfg)
    fresh.load_state_dict(None)  # a checkpoint from before guards were saved: fresh counters
    assert fresh.after_step(3, rows[2])["guard/length_pinned"] == 0.0
