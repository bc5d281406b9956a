"""placement.auto and the sizer's stream mode (fully asynchronous, partial rollouts; orchestrator/placement/replace.py):
stream maps to placement.mode=disaggregated + rollout.mode=stream + algo.max_staleness=k, a streaming
run stays streaming, and only a one-step-off run may switch into stream (k never above its
algo.max_staleness). Expected step times are computed by hand from the sizer's laws (one measured size: generate
t = G / g, train t = T / g^0.9, sync ~ 0; stream's period reaches the overlap limit max(mean generate + sync,
train + sync), orchestrator/sizing/stream_sim.py)."""
import pytest

from orchestrator.config import load_config
from orchestrator.placement.replace import current_split, decide, mode_keys, to_overrides
from orchestrator.sizing.measurements import STREAM_GENERATE_KEY, STREAM_ROW_KEY
from orchestrator.sizing.workload import Split

CPU_RUN = "configs/grpo_arith_cpu.yaml"  # rollout.num_workers 1, trainer.num_workers 1, 32 samples per step
ASYNC = ["rollout.mode=one_step_off"]
STREAM = ["rollout.mode=stream"]


def cfg(*overrides: str):
    return load_config(CPU_RUN, ["placement.auto=true", *overrides])


def rows(generate: list[float], train_s: float, stream: bool = False) -> list[dict]:
    """One row per step with these whole-generation seconds (the first step's is dropped as warm-up): a stream
    run's as the engines' busy seconds (STREAM_GENERATE_KEY), a one-step-off run's as async/generate_s."""
    out = []
    for k, g in enumerate(generate, 1):
        row = {"step": k, "timing/generate_s": 0.1, "timing/train_s": train_s, "timing/weight_sync_s": 0.0,
               "timing/reward_s": 0.0, "rollout/tokens": 100}
        row.update({STREAM_ROW_KEY: 1.0, STREAM_GENERATE_KEY: g} if stream else {"async/generate_s": g})
        out.append(row)
    return out


def test_stream_split_maps_to_the_rollout_mode_keys_and_loads():
    c = cfg(*ASYNC, "algo.max_staleness=2", "sizing.total_gpus=4")
    over, why = to_overrides(c, Split("stream", 3, 1), k=2)
    assert why == "" and over == {"placement.mode": "disaggregated", "rollout.mode": "stream",
                                  "algo.max_staleness": 2, "rollout.num_workers": 3, "trainer.num_workers": 1}
    loaded = load_config(CPU_RUN, [*ASYNC, *(f"{k}={str(v).lower()}" for k, v in over.items())])  # the loader accepts it
    assert loaded.rollout.mode == "stream" and loaded.algo.max_staleness == 2 and loaded.rollout.num_workers == 3
    # the same keys whichever mode the run is in now (a loaded config holds rollout.mode only)
    assert mode_keys("async") == {"placement.mode": "disaggregated", "rollout.mode": "one_step_off"}
    with pytest.raises(ValueError, match="k \\(algo.max_staleness of a stream split\\): must be an integer >= 1"):
        mode_keys("stream")


def test_stream_refused_where_the_config_does_not_allow_it():
    # k above the run's staleness bound
    over, why = to_overrides(cfg(*ASYNC, "algo.max_staleness=1"), Split("stream", 1, 1), k=2)
    assert over is None and "k = 2 would admit samples older than algo.max_staleness=1 allows" in why
    # load-time validation: partial rollouts with algo.old_logprobs=trainer need a staleness correction
    over, why = to_overrides(cfg("algo.tis_cap=null"), Split("stream", 1, 1), k=1)
    assert over is None and "needs algo.tis_cap" in why
    # a streaming run cannot leave stream mode (its checkpoint's untrained groups are streamed requests)
    over, why = to_overrides(cfg(*STREAM), Split("async", 1, 1))
    assert over is None and "would drop the untrained streamed groups" in why


def test_async_run_switches_into_stream_when_it_is_faster():
    # generate 2, 6, 2, 6 s (median 4: multipliers 0.5, 1.5), train 4 s, sync ~0, rollout 1 + trainer 1.
    # one-step-off, k = 2: sync_m waits on the rollout GPUs for generate_{m+2}; per two steps a sync, train 4 s,
    # the next sync, then the long generation that started at the first sync (6 s): 10 s / 2 = 5 s per step.
    # stream, k = 2: the overlap limit max(mean generate 4 + 0, train 4 + 0) = 4 s (k = 1: 5 s, as one-step-off).
    found, why = decide(rows([12.0, 2.0, 6.0, 2.0, 6.0], 4.0), cfg(*ASYNC, "algo.max_staleness=2"))
    assert found is not None and found.split == Split("stream", 1, 1)
    assert found.overrides == {"placement.mode": "disaggregated", "rollout.mode": "stream",
                               "algo.max_staleness": 2, "rollout.num_workers": 1, "trainer.num_workers": 1}
    assert found.predicted_step_s == pytest.approx(4.0, rel=1e-6)
    assert found.current_step_s == pytest.approx(5.0, rel=1e-6)
    assert "re-placing to stream: rollout 1, trainer 1, k = 2: predicted 4 s per step (now 5 s)" in why
    # algo.max_staleness=1 caps stream at k = 1, which ties one-step-off (5 s): the run stays as it is
    found, why = decide(rows([12.0, 2.0, 6.0, 2.0, 6.0], 4.0), cfg(*ASYNC, "algo.max_staleness=1"))
    assert found is None and "the current placement (async: rollout 1, trainer 1, predicted 5 s" in why


def test_streaming_run_stays_streaming():
    # generate 10 s, train 1 s, k = 2, 4 devices. now: stream r1 t1 = max(10, 1) = 10 s. Best: r3 t1 =
    # max(10/3, 1) = 3.33 s (r2 t2: max(5, 2^-0.9) = 5 s), reached at k = 1 already: the smallest k is chosen
    c = cfg(*STREAM, "algo.max_staleness=2", "sizing.total_gpus=4")
    assert current_split(c) == Split("stream", 1, 1)
    found, why = decide(rows([30.0, 10.0, 10.0, 10.0], 1.0, stream=True), c)
    assert found.overrides == {"placement.mode": "disaggregated", "rollout.mode": "stream",
                               "algo.max_staleness": 1, "rollout.num_workers": 3, "trainer.num_workers": 1}
    assert found.predicted_step_s == pytest.approx(10 / 3, rel=1e-6)
    assert found.current_step_s == pytest.approx(10.0, rel=1e-6)
    assert "re-placing to stream: rollout 3, trainer 1, k = 1" in why
    # asked for a synchronous mode only: nothing this streaming run can express
    found, why = decide(rows([30.0, 10.0, 10.0, 10.0], 1.0, stream=True), c, modes=("disaggregated",))
    assert found is None and "no simulated placement can be expressed" in why
    assert "would drop the untrained streamed groups" in why
