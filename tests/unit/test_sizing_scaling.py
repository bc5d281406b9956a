"""Scaling-law fit (orchestrator.sizing.scaling): recovers known parameters from synthetic measurements."""
import pytest

from orchestrator.sizing.scaling import DEFAULT_ALPHA, FitError, Law, fit_law


def test_rollout_recovers_serial_and_parallel_part():
    truth = Law(3.0, 40.0, 1.0)
    law = fit_law("rollout", [(g, truth(g)) for g in (1, 2, 4)])
    assert (law.a, law.b, law.alpha) == pytest.approx((3.0, 40.0, 1.0), rel=1e-9)
    # two sizes are enough when the exponent is fixed: 43 at 1 GPU, 13 at 4 GPUs
    law2 = fit_law("rollout", [(1, 43.0), (4, 13.0)])
    assert (law2.a, law2.b) == pytest.approx((3.0, 40.0))


def test_trainer_recovers_exponent_from_four_sizes():
    truth = Law(2.0, 30.0, 0.8)
    law = fit_law("trainer", [(g, truth(g)) for g in (1, 2, 4, 8)])
    assert law.alpha == pytest.approx(0.8, abs=1e-4)
    assert law.a == pytest.approx(2.0, rel=1e-3)
    assert law.b == pytest.approx(30.0, rel=1e-3)
    assert "fitted to 4 sizes" in law.note


def test_trainer_power_law_through_two_sizes():
    # 100 s at 2 GPUs, 100 / 4**0.7 s at 8: alpha = ln(t1/t2) / ln(8/2) = 0.7
    law = fit_law("trainer", [(2, 100.0), (8, 100.0 / 4 ** 0.7)])
    assert law.a == 0.0 and law.alpha == pytest.approx(0.7)
    assert law(2) == pytest.approx(100.0) and law(8) == pytest.approx(100 / 4 ** 0.7)


def test_repeated_sizes_are_averaged_and_noise_is_tolerated():
    truth = Law(1.0, 50.0, 0.9)
    pts = [(g, truth(g) * f) for g in (1, 2, 4, 8, 16) for f in (0.98, 1.02)]
    law = fit_law("trainer", pts)
    assert law.alpha == pytest.approx(0.9, abs=0.02)
    for g in (1, 4, 16, 64):
        assert law(g) == pytest.approx(truth(g), rel=0.03)


def test_one_size_falls_back_to_default_exponent_and_says_so():
    law = fit_law("trainer", [(4, 10.0)])
    assert law.alpha == DEFAULT_ALPHA["trainer"] and law.a == 0.0 and law(4) == pytest.approx(10.0)
    assert law(8) == pytest.approx(10.0 / 2 ** 0.9)
    assert "measured at 4 GPUs only" in law.note and "assumed exponent 0.9" in law.note
    sync = fit_law("sync", [(2, 5.0)])
    assert sync(2) == sync(64) == 5.0 and "independent of the receiver count" in sync.note


def test_sync_grows_linearly_with_receivers():
    law = fit_law("sync", [(1, 2.5), (4, 4.0), (8, 6.0)])  # 2 + 0.5 g
    assert (law.a, law.b) == pytest.approx((2.0, 0.5))
    assert law.describe() == "t(g) = 2 + 0.5*g s"


def test_monotone_laws_never_negative():
    # time grows with GPUs (a bad measurement): the fit clamps to a constant, never a negative b
    law = fit_law("rollout", [(1, 10.0), (2, 12.0)])
    assert law.a >= 0 and law.b >= 0
    law = fit_law("trainer", [(1, 10.0), (2, 12.0)])
    assert law.alpha == 0.0 and law(1) == pytest.approx(law(64))


@pytest.mark.parametrize("points,match", [([], "no measurements"), ([(0, 1.0)], "GPU count"),
                                          ([(1, -2.0)], "seconds"), ([(1, float("nan"))], "seconds")])
def test_bad_points_raise(points, match):
    with pytest.raises(FitError, match=match):
        fit_law("trainer", points)
    with pytest.raises(FitError, match="role"):
        fit_law("critic", [(1, 1.0)])


@pytest.mark.parametrize("strategy", ["nccl", "disk"])
def test_sync_law_from_cost_model_matches_predict_sync(strategy):
    import math

    from orchestrator.sizing.sync_law import sync_law_from_cost_model
    from orchestrator.weight_sync import predict_sync, setup_from_fabric

    law = sync_law_from_cost_model(7e9, 2, strategy, gpus_per_engine=2, gpus_per_node=8, max_gpus=256)
    for g in (2, 16, 64, 256):
        setup = setup_from_fabric(7e9, 2, g // 2, 2, math.ceil(g / 8))
        assert law(g) == pytest.approx(predict_sync(setup)[strategy].seconds, rel=1e-6)  # linear in R and N
    with pytest.raises(ValueError, match="strategy"):
        sync_law_from_cost_model(7e9, strategy="pigeon")
