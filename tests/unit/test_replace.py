"""placement.auto's decision (orchestrator/placement/replace.py `decide`): warm-up metrics rows + the run config -> config
overrides, or None with the reason. Expected splits are computed by hand from the sizer's laws (one measured
size: generate t = G / g, train t = T / g^0.9, sync constant; disaggregated step = G/r + T/t^0.9 + S,
colocated step = G/g + switch/2 + T/g^0.9 + S + switch/2, orchestrator/sizing/sizer.py `proxy_step_s`)."""
import pytest
from omegaconf import OmegaConf

from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.placement.replace import MIN_GAIN, decide, default_modes, held_devices, with_overrides

CPU_RUN = "configs/grpo_arith_cpu.yaml"  # rollout.num_workers 1, trainer.num_workers 1, 32 samples per step


def rows(generate_s: float, train_s: float, steps: int = 3, sync_s: float = 0.0, **extra) -> list[dict]:
    """Metrics rows of `steps` steps; the first (warm-up, dropped by the measurement) 3x slower."""
    return [{"step": k, "timing/generate_s": generate_s * (3 if k == 1 else 1), "timing/train_s": train_s,
             "timing/weight_sync_s": sync_s, "timing/reward_s": 0.0, "rollout/tokens": 100, **extra}
            for k in range(1, steps + 1)]


def cfg(*overrides: str):
    return load_config(CPU_RUN, ["placement.auto=true", *overrides])


def test_equal_split_already_recommended_is_none():
    # generate 1 s, train 1 s on rollout 1 + trainer 1 = 2 devices: the only disaggregated split of 2
    found, why = decide(rows(1.0, 1.0), cfg())
    assert found is None
    assert "current placement (disaggregated: rollout 1, trainer 1, predicted 2 s per step)" in why
    assert "is the sizer's recommendation for 2 devices" in why


def test_rollout_bound_gets_more_rollout_workers():
    # generate 10 s, train 1 s, 4 devices: r3 t1 = 10/3 + 1 = 4.333 s; r2 t2 = 5 + 2^-0.9 = 5.536; r1 t3 = 10.37
    found, why = decide(rows(10.0, 1.0), cfg("sizing.total_gpus=4"))
    assert found is not None
    assert found.overrides == {"placement.mode": "disaggregated", "rollout.mode": "sync",
                               "rollout.num_workers": 3, "trainer.num_workers": 1}
    assert found.predicted_step_s == pytest.approx(10 / 3 + 1, rel=1e-6)
    assert found.current_step_s == pytest.approx(11.0, rel=1e-6)
    assert found.total == 4
    assert "re-placing to disaggregated: rollout 3, trainer 1: predicted 4.33 s per step (now 11 s)" in why


def test_insufficient_rows_are_none_with_the_reason():
    found, why = decide(rows(10.0, 1.0, steps=1), cfg("sizing.total_gpus=4"))
    assert found is None and "1 timed step(s) measured and the first is warm-up" in why
    assert "sizing.warmup_steps >= 2" in why
    found, why = decide([{"step": 1, "reward/mean": 0.5}, {"step": 2}], cfg("sizing.total_gpus=4"))
    assert found is None and "no step row has the timing keys timing/generate_s, timing/train_s" in why


def test_small_gain_is_not_worth_a_restart():
    # sync 20 s dominates: r2 t1 on 3 devices = 0.5 + 1 + 20 = 21.5 s vs 22 s now: 2.3% < MIN_GAIN
    found, why = decide(rows(1.0, 1.0, sync_s=20.0), cfg("sizing.total_gpus=3"))
    assert MIN_GAIN == 0.05 and found is None
    assert "predicted 21.5 s per step against 22 s now, less than 5% faster" in why


def test_colocated_only_with_a_measured_switch():
    assert default_modes("disaggregated", False) == ("disaggregated",)
    assert default_modes("disaggregated", True) == ("colocated", "disaggregated")
    assert default_modes("colocated", False) == ("colocated", "disaggregated")
    assert default_modes("async", False) == ("disaggregated", "async", "stream")
    assert default_modes("stream", True) == ("stream",)
    # switch 0.04 + 0.06 s measured (sleep + wake, inside the train / sync times: taken out of them):
    # colocated on 4 = 10/4 + 0.05 + 4^-0.9 + 0.05 = 2.887 s beats r3 t1 = 4.333 s
    measured = rows(10.0, 1.04, sync_s=0.06, **{"colocate/sleep_s": 0.04, "colocate/wake_s": 0.06})
    found, _ = decide(measured, cfg("sizing.total_gpus=4"))
    assert found.overrides == {"placement.mode": "colocated", "rollout.mode": "sync",
                               "rollout.num_workers": 4, "trainer.num_workers": 4}
    assert found.predicted_step_s == pytest.approx(2.5 + 0.1 + 4 ** -0.9, rel=1e-6)


def test_trainer_ranks_that_do_not_divide_the_batch_are_skipped():
    # train-bound, 4 devices: r1 t3 = 1 + 10/3^0.9 = 4.72 s is best, but 3 ranks do not divide 32 samples;
    # next: r2 t2 = 0.5 + 10/2^0.9 = 5.86 s
    found, _ = decide(rows(1.0, 10.0), cfg("sizing.total_gpus=4"), modes=("disaggregated",))
    assert found.overrides["trainer.num_workers"] == 2 and found.overrides["rollout.num_workers"] == 2
    assert found.predicted_step_s == pytest.approx(0.5 + 10 / 2 ** 0.9, rel=1e-6)


def test_reference_keeps_its_own_device_and_device_amounts():
    # KL on: the reference is 1 device (one ReferenceActor); splits with it on the trainer are not expressible
    c = cfg("algo.kl_coef=0.01", "placement.resource=GPU", "sizing.total_gpus=5")
    assert held_devices(c) == 3
    found, _ = decide(rows(10.0, 1.0), c)
    assert found.split.reference == 1 and found.overrides["rollout.num_workers"] == 3
    assert found.overrides["placement.rollout_per_worker"] == 1.0
    assert found.overrides["placement.reference_per_worker"] == 1.0


def test_with_overrides_copies_and_validates():
    c = cfg()
    new = with_overrides(c, {"rollout.num_workers": 2})
    assert new.rollout.num_workers == 2 and c.rollout.num_workers == 1
    assert OmegaConf.is_readonly(new)
    with pytest.raises(ConfigError, match="trainer.num_workers=3 must divide"):
        with_overrides(c, {"trainer.num_workers": 3})


def test_auto_placement_needs_warmup_below_total_steps():
    with pytest.raises(ConfigError, match="sizing.warmup_steps=4 with placement.auto=true must be below "
                                          "trainer.total_steps=4"):
        load_config(CPU_RUN, ["placement.auto=true", "sizing.warmup_steps=4", "trainer.total_steps=4"])
    load_config(CPU_RUN, ["placement.auto=false", "sizing.warmup_steps=4", "trainer.total_steps=4"])
    load_config(CPU_RUN, ["placement.auto=true", "sizing.warmup_steps=3", "trainer.total_steps=4"])
