"""The guarded optimizer step (actors/trainer/finite.py) and the Trainer's skipped updates: a NaN loss, an
inf gradient or an update that makes the weights non-finite leave the weights and the AdamW state bit for bit
as they were; the next good step is the one an untouched optimizer would take."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import OmegaConf

from actors.trainer import finite
from actors.trainer.trainer import Trainer
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from tests.unit.trainer_helpers import random_batch, save_tiny_llama


def _model_and_optimizer(lr: float = 1e-2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)


def _backward(model, scale: float = 1.0) -> float:
    """One backward of a fixed batch; returns the loss (times `scale`: nan / inf make it non-finite)."""
    model.zero_grad(set_to_none=True)
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    loss = model(x).pow(2).mean() * scale
    loss.backward()
    return float(loss.detach())


def _state(model, opt) -> tuple:
    return ([p.detach().clone() for p in model.parameters()],
            {i: {k: v.clone() for k, v in st.items()} for i, st in enumerate(opt.state.values())})


def _assert_same(a, b) -> None:
    (pa, sa), (pb, sb) = a, b
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert sa.keys() == sb.keys()
    for i in sa:
        assert sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k]) for k in sa[i])


def _step(model, opt, scale=1.0, grad_fill=None):
    loss = _backward(model, scale)
    if grad_fill is not None:
        next(model.parameters()).grad[0, 0] = grad_fill
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    return finite.guarded_step(opt, math.isfinite(loss), norm, 1.0)


@pytest.mark.parametrize("scale, grad_fill, reason", [(math.nan, None, "loss"), (math.inf, None, "loss"),
                                                      (1.0, math.inf, "grad_norm"), (1.0, math.nan, "grad_norm")])
def test_a_non_finite_loss_or_gradient_leaves_weights_and_state_bit_identical(scale, grad_fill, reason):
    model, opt = _model_and_optimizer()
    assert _step(model, opt) == (None, False)  # a good step first: the AdamW state exists
    before, untouched = _state(model, opt), copy.deepcopy((model, opt))
    assert _step(model, opt, scale, grad_fill) == (reason, False)
    _assert_same(before, _state(model, opt))
    # the next good step equals the one of an optimizer that never saw the bad step
    assert _step(model, opt) == _step(*untouched) == (None, False)
    _assert_same(_state(*untouched), _state(model, opt))


def test_a_skip_on_the_first_step_leaves_no_optimizer_state():
    model, opt = _model_and_optimizer()
    before = _state(model, opt)
    assert _step(model, opt, math.nan) == ("loss", False)
    _assert_same(before, _state(model, opt))
    assert len(opt.state) == 0


@pytest.mark.parametrize("first", [True, False])
def test_an_update_that_makes_the_weights_non_finite_is_undone(first):
    """lr = inf: finite loss and gradients, but the updated weights are NaN; the bound sees it coming, copies,
    and restores the weights and the AdamW state (absent on a first step) bit for bit."""
    model, opt = _model_and_optimizer()
    if not first:
        assert _step(model, opt) == (None, False)
    before = _state(model, opt)
    for g in opt.param_groups:
        g["lr"] = math.inf
    assert _step(model, opt) == ("weights", True)
    _assert_same(before, _state(model, opt))
    assert len(opt.state) == (0 if first else 4)
    for g in opt.param_groups:
        g["lr"] = 1e30  # finite but absurd: weights of ~1e30 are finite, so it is applied (config refuses it)
    assert _step(model, opt)[0] is None


def test_the_bound_copies_only_when_a_step_could_overflow():
    model, opt = _model_and_optimizer()
    _step(model, opt)
    assert finite.step_is_safe(opt, 1.0)
    opt.param_groups[0]["lr"] = 1e40
    assert not finite.step_is_safe(opt, 1.0)
    opt.param_groups[0]["lr"] = 1e-2
    assert not finite.step_is_safe(opt, math.inf)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert not finite.step_is_safe(sgd, 1.0)  # other optimizers: always a copy


def test_adamw_bound_is_an_upper_bound_of_the_real_step():
    model, opt = _model_and_optimizer(lr=0.5)
    for _ in range(3):
        _backward(model)
        g = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        params = list(model.parameters())
        p_max = max(float(p.detach().abs().max()) for p in params)
        m_max = max((float(opt.state[p]["exp_avg"].abs().max()) for p in params if p in opt.state), default=0.0)
        t = float(opt.state[params[0]]["step"]) + 1 if params[0] in opt.state else 1.0
        bound = finite.adamw_bound(opt.param_groups[0], p_max, m_max, g, t)
        opt.step()
        assert max(float(p.detach().abs().max()) for p in params) <= bound


def test_all_finite_tells_overflowing_norms_from_non_finite_values():
    big = torch.full((1000,), 3e37)  # finite, but its 2-norm overflows float32
    assert finite.all_finite([big, torch.ones(3)])
    assert not finite.all_finite([big, torch.tensor([1.0, math.nan])])
    assert not finite.all_finite([torch.tensor([math.inf])])
    assert finite.all_finite([])


def test_outcome_counts_and_trailing_skips():
    assert finite.outcome_metrics("grad_norm", False) == {
        "actor/skipped_updates": 1.0, "actor/update_copies": 0.0, "actor/nonfinite_loss": 0.0,
        "actor/nonfinite_grad_norm": 1.0, "actor/nonfinite_weights": 0.0}
    assert finite.outcome_metrics(None, True)["actor/skipped_updates"] == 0.0
    assert [finite.trailing_skips(s) for s in ([0.0], [1.0], [1.0, 0.0], [0.0, 1.0, 1.0])] == [0, 1, 0, 2]


# ---- the Trainer (tiny random Llama, plain torch) ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny"))


def _trainer(tiny, **over):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 5e-2, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32", **over})
    return Trainer(str(tiny), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=8)


def _nan_batch(seed=1):
    b = random_batch(8, seed)
    b.advantages[5] = [math.nan] * len(b.advantages[5])
    return b


def _snapshot(trainer: Trainer):
    return ({k: v.clone() for k, v in trainer.model.state_dict().items()}, trainer.optimizer_state()["state"],
            trainer.scheduler.state_dict(), trainer.step)


def _assert_same_trainer_state(a, b):
    assert a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert a[1].keys() == b[1].keys()
    assert all(torch.equal(a[1][n][k], b[1][n][k]) for n in a[1] for k in a[1][n])
    assert a[2] == b[2] and a[3] == b[3]


def test_trainer_skips_a_nan_advantage_step_and_then_trains_as_if_it_never_happened(tiny):
    t, twin = _trainer(tiny), _trainer(tiny)
    for tr in (t, twin):
        tr.train_step(random_batch(8, 0))
    before = _snapshot(t)
    m = t.train_step(_nan_batch())
    assert m["actor/skipped_updates"] == 1.0 and m["actor/nonfinite_loss"] == 1.0 and m["actor/skipped_trailing"] == 1.0
    assert math.isnan(m["actor/loss"])
    _assert_same_trainer_state(before, _snapshot(t))
    assert all(p.grad is None for p in t.model.parameters())  # the accumulated gradients are dropped
    good = [tr.train_step(random_batch(8, 2)) for tr in (t, twin)]
    assert good[0]["actor/skipped_updates"] == 0.0 and good[0]["actor/loss"] == good[1]["actor/loss"]
    _assert_same_trainer_state(_snapshot(twin), _snapshot(t))


def test_trainer_counts_skips_per_mini_batch(tiny):
    t = _trainer(tiny, mini_batches=2)
    b = random_batch(8, 3)
    b.advantages[0] = [math.nan] * len(b.advantages[0])  # sample 0 lands in the first mini-batch only
    m = t.train_step(b)
    assert m["actor/skipped_updates"] == 1.0 and m["actor/skipped_trailing"] == 0.0 and t.step == 1
