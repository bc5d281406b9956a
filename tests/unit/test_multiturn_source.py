"""The multi-turn rollout source without Ray: sticky placement, env rewards, metric aggregation."""
from __future__ import annotations

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.rollout.multi_turn_source import MultiTurnSource, _rollout_metrics
from orchestrator.rollout.types import MultiTurnInfo, PromptRequest, Trajectory


def _cfg(*extra):
    return load_config("configs/grpo_guessing_cpu.yaml", ["rollout.num_workers=2", "rollout.n=3", *extra])


def test_route_keeps_each_group_on_one_worker_under_the_load_cap():
    phase = MultiTurnSource(_cfg(), [None, None], wait=None)
    requests = [PromptRequest(group_id=g, prompt_ids=[1], answer=str(g), prompt=f"q{g}") for g in range(8)]
    shards = phase.route(requests)
    placed = [g["group_id"] for groups in shards.values() for g in groups]
    assert sorted(placed) == list(range(8))  # every group once, with all its n samples
    assert all(g["n"] == 3 and g["sample"] == {"prompt": f"q{g['group_id']}", "answer": str(g["group_id"]),
                                               "seed": g["group_id"]} for gs in shards.values() for g in gs)
    assert max(len(gs) for gs in shards.values()) <= 5  # ceil(1.25 * 8 / 2) = 5
    assert phase.route(requests) == shards  # still placed (not released): the same workers


def test_bad_env_kwargs_fail_before_any_actor():
    # a built-in environment is built once when the config loads: the guessing game's kwargs fail there
    with pytest.raises(ValueError, match="env.name='calculator': cannot build it with env.kwargs=.*'low'"):
        MultiTurnSource(_cfg("env.name=calculator"), [None, None], wait=None)


def _traj(group, reward, turns, mask, truncated=False, stop="done"):
    info = MultiTurnInfo(loss_mask=mask, turn_rewards=[reward], num_turns=turns,
                         stop_reason="max_turns" if truncated else stop)
    return Trajectory(group_id=group, prompt_ids=[1], response_ids=[0] * len(mask), logprobs=[0.0] * len(mask),
                      finish_reason="stop", multiturn=info)


def test_rewards_come_from_the_environment():
    phase = MultiTurnSource(_cfg(), [None, None], wait=None)
    row: dict = {}
    assert phase.rewards([_traj(0, 1.0, 1, [1]), _traj(0, 0.0, 2, [1, 0, 1]), _traj(1, 0.5, 1, [1])], row) == [1.0, 0.0, 0.5]
    assert row["reward/mean"] == pytest.approx(0.5) and row["reward/std"] == pytest.approx(0.5)
    assert (row["reward/max"], row["reward/min"]) == (1.0, 0.0)


def test_metrics_aggregate_over_workers():
    trajs = [_traj(0, 1.0, 1, [1, 1]), _traj(0, 0.0, 3, [1, 0, 0, 1, 0, 1], truncated=True), _traj(1, 0.0, 2, [1, 0, 1])]
    base = {"env/errors": 0.0, "env/timeouts": 0.0, "env/reset_failures": 0.0, "rollout/in_flight_max": 2.0}
    w0 = dict(base, **{"rollout/trajectories": 2.0, "rollout/turns_mean": 2.0, "env/step_s_mean": 0.1,
                       "rollout/tokens": 5.0, "rollout/tokens_per_s": 10.0, "rollout/generate_s": 2.0,
                       "rollout/prefill_tokens_requested": 100.0, "rollout/prefill_tokens_computed": 40.0})
    w1 = dict(base, **{"rollout/trajectories": 1.0, "rollout/turns_mean": 2.0, "env/step_s_mean": 0.4,
                       "rollout/tokens": 2.0, "rollout/tokens_per_s": 4.0, "rollout/generate_s": 1.0,
                       "rollout/prefill_tokens_requested": 50.0, "rollout/prefill_tokens_computed": 50.0,
                       "env/errors": 1.0})
    m = _rollout_metrics(trajs, [(0, w0), (1, w1)], num_workers=3)
    assert m["rollout/turns_mean"] == pytest.approx(2.0) and m["rollout/turns_max"] == 3.0
    assert m["rollout/truncated_frac"] == pytest.approx(1 / 3)
    assert m["rollout/sampled_len_mean"] == pytest.approx(7 / 3) and m["rollout/response_len_mean"] == pytest.approx(11 / 3)
    assert m["rollout/prefix_cache_hit_rate"] == pytest.approx(60 / 150)
    assert m["env/step_s"] == pytest.approx((0.1 * 4 + 0.4 * 2) / 6)  # weighted by the turns each worker ran
    assert m["env/errors"] == 1.0 and m["rollout/tokens_per_s"] == 14.0
    assert (m["rollout/worker0_tokens_per_s"], m["rollout/worker1_tokens_per_s"], m["rollout/worker2_tokens_per_s"]) == (10.0, 4.0, 0.0)


@pytest.mark.parametrize("override, message", [
    ("env.name=no_such_pkg.envs:Env", "env.name='no_such_pkg.envs:Env': cannot import module"),
    ("env.name=orchestrator.envs.guessing:Nope", "has no attribute 'Nope'"),
    ("env.render_mode=lazy", r"env.render_mode='lazy' is not allowed; choose one of \['strict', 'incremental'\]"),
    ("env.max_tokens=4096", r"env.max_tokens=4096 > rollout.max_model_len=1024"),
    ("env.step_timeout_s=0", "env.step_timeout_s=0.0: need > 0"),
    ("rollout.block_size=-32", "rollout.block_size=-32 must be >= 0"),
])
def test_bad_env_config_is_rejected_naming_the_key(override, message):
    from orchestrator.config.load import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config("configs/grpo_guessing_cpu.yaml", [override])


def _failed_batch():
    """2 groups x n=3 = 6 episodes on 2 workers: 1 reset timed out and 1 reset raised (no trajectory each),
    2 episodes ended by a step that raised (env_error), 2 finished."""
    def traj(group, error=""):
        t = _traj(group, 0.5, 2, [1, 0, 1], stop="env_error" if error else "done")
        t.multiturn.env_error = error
        return t
    step_error = "env step error: RuntimeError: boom"
    base = {"rollout/trajectories": 2.0, "rollout/turns_mean": 2.0, "env/step_s_mean": 0.1, "rollout/tokens": 4.0,
            "rollout/tokens_per_s": 2.0, "rollout/generate_s": 1.0, "rollout/prefill_tokens_requested": 10.0,
            "rollout/prefill_tokens_computed": 5.0, "rollout/in_flight_max": 3.0}
    w0 = ([traj(0), traj(0, step_error)], dict(base, **{"env/errors": 2.0, "env/timeouts": 1.0, "env/reset_failures": 1.0}))
    w1 = ([traj(1), traj(1, step_error)], dict(base, **{"env/errors": 2.0, "env/timeouts": 0.0, "env/reset_failures": 1.0}))
    requests = [PromptRequest(group_id=g, prompt_ids=[1], answer="", prompt="q") for g in (0, 1)]
    return requests, [w0, w1]


def _collect(max_failed_frac: float, row: dict):
    from orchestrator.rollout.source import Launched

    requests, results = _failed_batch()
    source = MultiTurnSource(_cfg(f"env.max_failed_frac={max_failed_frac}"), [None, None], wait=lambda ref: results[int(ref[-1])])
    launched = Launched(requests, [0, 1], ["ref0", "ref1"], meta={"groups_per_worker_max": 1})
    return source.collect(launched, -1, row)


def test_env_failures_past_the_fraction_stop_the_run_naming_the_env_and_what_to_do():
    from orchestrator.reward import TooManyFailuresError

    row = {"step": 4}
    with pytest.raises(TooManyFailuresError) as info:
        _collect(0.5, row)  # 4 of 6 episodes failed: 0.67 > 0.5
    message = str(info.value)
    for text in ("step 4: 4 of 6 environment episodes failed", "env.max_failed_frac=0.5",
                 "'guessing': 1 timeout, 3 errors",
                 "env.step_timeout_s (now 10 s)", "first error: env step error: RuntimeError: boom"):
        assert text in message, (text, message)
    assert row["env/failed_frac"] == pytest.approx(4 / 6)


def test_env_failures_within_the_fraction_train_on():
    row = {"step": 4}
    trajs = _collect(0.7, row)
    assert len(trajs) == 4 and row["env/failed_frac"] == pytest.approx(4 / 6)
    assert row["env/errors"] == 4.0 and row["env/timeouts"] == 1.0 and row["env/reset_failures"] == 2.0
    with pytest.raises(ConfigError, match=r"env.max_failed_frac=1.5: need a fraction in \[0, 1\]"):
        _cfg("env.max_failed_frac=1.5")
