"""Unit tests of orchestrator.algo.loss: policy loss, loss normalisation, cases C01 and C02.

The sweep checks the contract of ``loss_normalizer``: for every ``loss_agg`` the loss and gradient of a
global batch are the same un-split and split into data-parallel shards (gradients averaged) and
micro-batches (gradients accumulated).
"""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.algo import kl_penalty, loss_normalizer, policy_loss, token_logprobs

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
WIDE = {"clip_low": 0.2, "clip_high": 10.0}  # no clipping for ratios in [0.8, 11]


def _c01_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """C01's per-token losses [2, 4, 6] and [1] as ratios with advantage -1 (loss = ratio)."""
    values = torch.tensor([[2.0, 4.0, 6.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return values.log(), mask


def _loss(logprobs: torch.Tensor, mask: torch.Tensor, normalizer: float, agg: str = "token-mean",
          adv: float = -1.0, **kw: object) -> torch.Tensor:
    advantages = torch.full((logprobs.shape[0],), adv)
    loss, _ = policy_loss(logprobs, torch.zeros_like(logprobs), advantages, mask, loss_agg=agg,
                          normalizer=normalizer, **{**WIDE, **kw})
    return loss


def test_hand_values_per_mode_unsplit() -> None:
    lp, mask = _c01_batch()
    assert _loss(lp, mask, loss_normalizer(mask, "token-mean")).item() == pytest.approx(13 / 4)
    # per-sequence means 4 and 1 -> 2.5
    n = loss_normalizer(mask, "seq-mean-token-mean")
    assert _loss(lp, mask, n, "seq-mean-token-mean").item() == pytest.approx(2.5)
    # Dr. GRPO: sums 12 and 1, each / max_response_len 4, mean over 2 sequences -> 1.625
    n = loss_normalizer(mask, "seq-mean-token-sum-norm", max_response_len=4)
    assert _loss(lp, mask, n, "seq-mean-token-sum-norm", max_response_len=4).item() == pytest.approx(1.625)


def test_c01_two_micro_batches_use_global_token_count() -> None:
    lp, mask = _c01_batch()
    n = loss_normalizer(mask, "token-mean")
    assert n == 4.0
    total = sum(_loss(lp[i : i + 1], mask[i : i + 1], n) for i in range(2))
    assert total.item() == pytest.approx(3.25, abs=1e-5)
    # The fault: each micro-batch normalised by its own token count, then averaged.
    wrong = sum(_loss(lp[i : i + 1], mask[i : i + 1], loss_normalizer(mask[i : i + 1], "token-mean"))
                for i in range(2)) / 2
    assert wrong.item() == pytest.approx(2.5, abs=1e-5)


def _c01_grad(micro_batches: list[slice], per_micro_batch_mean: bool) -> float:
    """dL/dw for per-token loss w * x with x = [1, 2, 3] and [10] (ratio exp(w x - sg(w x)), A = -1)."""
    x = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = torch.tensor(0.0, requires_grad=True)
    losses = []
    for mb in micro_batches:
        lp = w * x[mb]
        norm = loss_normalizer(mask[mb] if per_micro_batch_mean else mask, "token-mean")
        adv = torch.full((lp.shape[0],), -1.0)
        loss, _ = policy_loss(lp, lp.detach(), adv, mask[mb], loss_agg="token-mean", normalizer=norm, **WIDE)
        losses.append(loss)
    total = torch.stack(losses).mean() if per_micro_batch_mean else torch.stack(losses).sum()
    (grad,) = torch.autograd.grad(total, w)
    return grad.item()


def test_c01_gradient_is_global_token_mean() -> None:
    split = [slice(0, 1), slice(1, 2)]
    assert _c01_grad([slice(0, 2)], per_micro_batch_mean=False) == pytest.approx(4.0, abs=1e-5)
    assert _c01_grad(split, per_micro_batch_mean=False) == pytest.approx(4.0, abs=1e-5)
    assert _c01_grad(split, per_micro_batch_mean=True) == pytest.approx(6.0, abs=1e-5)  # the fault


@pytest.mark.parametrize("num_micro_batches", [1, 2, 4])
def test_c02_loss_and_grad_norm_do_not_depend_on_accumulation_count(num_micro_batches: int) -> None:
    # The four C01 tokens as four one-token sequences; logprob = log(v) + w * x, ratio = v * exp(w x).
    v = torch.tensor([[2.0], [4.0], [6.0], [1.0]])
    x = torch.tensor([[1.0], [2.0], [3.0], [10.0]])
    mask = torch.ones(4, 1, dtype=torch.int64)
    n = loss_normalizer(mask, "token-mean")
    w = torch.zeros(2, requires_grad=True)  # two parameters so that the norm is a real norm
    total = torch.zeros(())
    for rows in torch.arange(4).tensor_split(num_micro_batches):
        lp = v[rows].log() + w[0] * x[rows] + w[1] * x[rows] ** 0.5
        loss = _loss(lp, mask[rows], n)
        loss.backward()
        total = total + loss.detach()
    assert total.item() == pytest.approx(3.25, abs=1e-5)
    if num_micro_batches > 1:  # the fault: dividing again by the number of micro-batches
        assert total.item() != pytest.approx(3.25 / num_micro_batches, abs=1e-3)
    expected = torch.tensor([(2 * 1 + 4 * 2 + 6 * 3 + 1 * 10) / 4,
                             (2 * 1 + 4 * 2**0.5 + 6 * 3**0.5 + 1 * 10**0.5) / 4])
    torch.testing.assert_close(w.grad, expected, atol=1e-5, rtol=0)
    assert w.grad.norm().item() == pytest.approx(expected.norm().item(), abs=1e-5)


# --------------------------------------------------------------------------- sweep over splits

B, T, V, H = 8, 6, 11, 5
CLIP_LOW, CLIP_HIGH, KL_COEF, TIS_CAP = 0.2, 0.28, 0.1, 1.5


def _sweep_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # includes an empty and a full response
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    mask[7] = torch.tensor([0, 0, 1, 1, 1, 1])  # one left-aligned gap, masks need not be prefixes
    base = torch.randn(B, T, generator=gen) * 0.5 - 2.0
    return {
        "features": torch.randn(B, T, H, generator=gen),
        "tokens": torch.randint(0, V, (B, T), generator=gen),
        "mask": mask,
        "advantages": torch.randn(B, generator=gen),
        "old_noise": torch.randn(B, T, generator=gen) * 0.3,
        "ref_logprobs": base,
        "rollout_noise": torch.randn(B, T, generator=gen) * 0.5,
    }


def _micro_batch_loss(layer: torch.nn.Linear, data: dict[str, torch.Tensor], rows: torch.Tensor,
                      agg: str, normalizer: float) -> tuple[torch.Tensor, dict[str, float]]:
    logits = layer(data["features"][rows])
    lp = token_logprobs(logits, data["tokens"][rows], temperature=0.7)
    old = lp.detach() + data["old_noise"][rows]
    return policy_loss(lp, old, data["advantages"][rows], data["mask"][rows], clip_low=CLIP_LOW,
                       clip_high=CLIP_HIGH, loss_agg=agg, normalizer=normalizer, max_response_len=T,
                       ref_logprobs=data["ref_logprobs"][rows], kl_coef=KL_COEF, kl_estimator="k3",
                       rollout_logprobs=old + data["rollout_noise"][rows], tis_cap=TIS_CAP)


def _split_loss_and_grad(layer: torch.nn.Linear, data: dict[str, torch.Tensor], agg: str,
                         dp_size: int, num_micro_batches: int) -> tuple[float, torch.Tensor]:
    """Simulate DP shards: each accumulates its micro-batch gradients; then average over shards."""
    normalizer = loss_normalizer(data["mask"], agg, max_response_len=T, dp_size=dp_size)
    loss_total, grad_total = 0.0, torch.zeros(sum(p.numel() for p in layer.parameters()))
    for shard in torch.arange(B).tensor_split(dp_size):
        layer.zero_grad(set_to_none=False)
        shard_loss = 0.0
        for rows in shard.tensor_split(num_micro_batches):  # uneven and empty micro-batches included
            loss, _ = _micro_batch_loss(layer, data, rows, agg, normalizer)
            loss.backward()
            shard_loss += loss.item()
        loss_total += shard_loss / dp_size
        grad_total += torch.cat([p.grad.flatten() for p in layer.parameters()]) / dp_size
    return loss_total, grad_total


def _reference_loss(layer: torch.nn.Linear, data: dict[str, torch.Tensor], agg: str) -> torch.Tensor:
    """The un-split loss written out from the formulas, independently of ``policy_loss``."""
    lp = token_logprobs(layer(data["features"]), data["tokens"], temperature=0.7)
    old = lp.detach() + data["old_noise"]
    ratio = torch.exp(lp - old)
    adv = data["advantages"][:, None]
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH))
    weight = torch.exp(-data["rollout_noise"]).clamp(max=TIS_CAP)
    per_token = pg * weight + KL_COEF * kl_penalty(lp, data["ref_logprobs"], "k3")
    seqs = []
    for b in range(B):
        m = data["mask"][b].bool()
        if m.any():
            seqs.append({"token-mean": per_token[b][m].sum(), "seq-mean-token-mean": per_token[b][m].mean(),
                         "seq-mean-token-sum-norm": per_token[b][m].sum() / T}[agg])
    if agg == "token-mean":
        return torch.stack(seqs).sum() / data["mask"].sum()
    return torch.stack(seqs).mean()


@pytest.mark.parametrize("agg", MODES)
def test_sweep_split_equals_unsplit(agg: str) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(H, V)
    data = _sweep_batch()

    ref = _reference_loss(layer, data, agg)
    ref_grad = torch.cat([g.flatten() for g in torch.autograd.grad(ref, list(layer.parameters()))])
    unsplit_loss, unsplit_grad = _split_loss_and_grad(layer, data, agg, 1, 1)
    assert unsplit_loss == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(unsplit_grad, ref_grad, atol=1e-6, rtol=0)
    assert unsplit_grad.abs().max() > 1e-3  # the gradient is not trivially zero

    _, metrics = _micro_batch_loss(layer, data, torch.arange(B), agg, 1.0)
    assert 0 < metrics["actor/clip_frac"] < 1  # both clip branches are exercised
    assert metrics["actor/tokens"] == float(data["mask"].sum())

    for dp_size in (1, 2, 4):
        for num_micro_batches in (1, 2, 4, 8):
            loss, grad = _split_loss_and_grad(layer, data, agg, dp_size, num_micro_batches)
            assert loss == pytest.approx(unsplit_loss, abs=1e-6), (dp_size, num_micro_batches)
            torch.testing.assert_close(grad, unsplit_grad, atol=1e-6, rtol=0,
                                       msg=f"dp_size={dp_size} micro_batches={num_micro_batches}")


# --------------------------------------------------------------------------- clipping, TIS, KL, masks

RATIOS = [1.5, 1.25, 0.5, 0.5, 0.75, 1.5]
ADVS = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
# per-token loss max(-A r, -A clamp(r, 0.8, 1.28)), and whether the clipped branch is active
EXPECTED = [-1.28, -1.25, -0.5, 0.8, 0.8, 1.5]
CLIPPED = [True, False, False, True, True, False]


def test_clip_higher_asymmetric_hand_values_and_gradients() -> None:
    lp = torch.tensor(RATIOS).log()[:, None].requires_grad_()
    mask = torch.ones(6, 1)
    loss, metrics = policy_loss(lp, torch.zeros(6, 1), torch.tensor(ADVS), mask, clip_low=0.2,
                                clip_high=0.28, loss_agg="token-mean", normalizer=1.0)
    assert loss.item() == pytest.approx(sum(EXPECTED), abs=1e-5)
    loss.backward()
    # clipped tokens get no gradient; unclipped ones d(-A r)/dlogp = -A r
    expected_grad = [0.0 if c else -a * r for r, a, c in zip(RATIOS, ADVS, CLIPPED)]
    torch.testing.assert_close(lp.grad.flatten(), torch.tensor(expected_grad), atol=1e-5, rtol=0)
    assert metrics["actor/clip_frac"] == pytest.approx(0.5)
    assert metrics["actor/ratio_mean"] == pytest.approx(sum(RATIOS) / 6, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(sum(EXPECTED) / 6, abs=1e-6)
    assert metrics["actor/kl"] == 0.0 and metrics["actor/tokens"] == 6.0
    assert "actor/tis_weight_mean" not in metrics
    # symmetric clipping (0.2, 0.2) clips the ratio 1.25 of a positive advantage to 1.2
    symmetric, _ = policy_loss(lp.detach()[1:2], torch.zeros(1, 1), torch.tensor([1.0]), mask[:1],
                               clip_low=0.2, clip_high=0.2, loss_agg="token-mean", normalizer=1.0)
    assert symmetric.item() == pytest.approx(-1.2, abs=1e-5)


def test_tis_weight_is_capped_detached_and_skips_the_kl_term() -> None:
    lp = torch.zeros(1, 3, requires_grad=True)
    old = torch.zeros(1, 3)
    rollout = torch.tensor([[-math.log(3.0), math.log(2.0), 0.0]], requires_grad=True)  # w = 3, 0.5, 1
    ref = torch.full((1, 3), -1.0)  # k1 = logp - ref = 1 per token
    loss, metrics = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 3), clip_low=0.2, clip_high=0.2,
                                loss_agg="token-mean", normalizer=3.0, ref_logprobs=ref, kl_coef=0.5,
                                kl_estimator="k1", rollout_logprobs=rollout, tis_cap=2.0)
    weights = [2.0, 0.5, 1.0]  # 3 capped to 2
    assert loss.item() == pytest.approx((-sum(weights) + 0.5 * 3) / 3, abs=1e-6)
    assert metrics["actor/tis_weight_mean"] == pytest.approx(3.5 / 3, abs=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(-3.5 / 3, abs=1e-6)
    assert metrics["actor/kl"] == pytest.approx(1.0)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[(-w + 0.5) / 3 for w in weights]]), atol=1e-6, rtol=0)
    assert rollout.grad is None  # the weight is detached


def test_kl_term_added_with_coefficient() -> None:
    lp = torch.tensor([[0.0, 0.0]])
    ref = torch.tensor([[math.log(2.0), 0.0]])
    kw = {"clip_low": 0.2, "clip_high": 0.2, "loss_agg": "token-mean", "normalizer": 2.0}
    base, _ = policy_loss(lp, lp, torch.tensor([0.5]), torch.ones(1, 2), **kw)
    with_kl, metrics = policy_loss(lp, lp, torch.tensor([0.5]), torch.ones(1, 2), ref_logprobs=ref,
                                   kl_coef=0.1, **kw)
    assert base.item() == pytest.approx(-0.5)
    assert with_kl.item() == pytest.approx(-0.5 + 0.1 * 0.306853 / 2, abs=1e-6)
    assert metrics["actor/kl"] == pytest.approx(0.306853 / 2, abs=1e-6)


@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("agg", MODES)
def test_masked_nan_and_inf_do_not_leak(agg: str, kl_estimator: str) -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    clean = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-0.5, -1.0, -1.0]])
    dirty = torch.where(mask.bool(), clean, torch.tensor([[float("nan")], [float("inf")], [-float("inf")]]))
    adv_clean, adv_dirty = torch.tensor([1.0, 0.0, -2.0]), torch.tensor([1.0, float("nan"), -2.0])

    def run(lp_values: torch.Tensor, adv: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
        lp = lp_values.clone().requires_grad_()
        other = torch.where(mask.bool(), clean - 0.1, torch.full_like(clean, fill))
        loss, metrics = policy_loss(lp, other, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg=agg,
                                    normalizer=loss_normalizer(mask, agg, max_response_len=3),
                                    max_response_len=3,
                                    ref_logprobs=other, kl_coef=0.1, kl_estimator=kl_estimator,
                                    rollout_logprobs=other, tis_cap=2.0)
        assert all(math.isfinite(v) for v in metrics.values())
        loss.backward()
        return loss.detach(), lp.grad

    loss_clean, grad_clean = run(clean, adv_clean, 0.0)
    loss_dirty, grad_dirty = run(dirty, adv_dirty, float("nan"))
    assert torch.isfinite(loss_dirty) and torch.isfinite(grad_dirty).all()
    assert torch.equal(loss_dirty, loss_clean)
    assert torch.equal(grad_dirty, grad_clean)
    assert torch.equal(grad_dirty[~mask.bool()], torch.zeros(int((~mask.bool()).sum())))


# --------------------------------------------------------------------------- normaliser and errors


def test_loss_normalizer_values() -> None:
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 1, 1]])
    assert loss_normalizer(mask, "token-mean") == 6.0
    assert loss_normalizer(mask, "token-mean", dp_size=4) == 1.5
    assert loss_normalizer(mask.bool(), "seq-mean-token-mean", dp_size=2) == 1.5  # 3 non-empty sequences
    assert loss_normalizer(mask, "seq-mean-token-sum-norm", max_response_len=3) == 3.0


@pytest.mark.parametrize(
    ("mask", "agg", "kwargs", "match"),
    [
        (torch.zeros(2, 3), "token-mean", {}, "response_mask"),
        (torch.zeros(2, 3), "seq-mean-token-mean", {}, "response_mask"),
        (torch.ones(2, 3), "seq-mean-token-sum-norm", {}, "max_response_len"),
        (torch.ones(2, 3), "sum", {}, r"loss_agg.*token-mean.*seq-mean-token-mean.*seq-mean-token-sum-norm"),
        (torch.ones(2, 3), "token-mean", {"dp_size": 0}, "dp_size"),
        (torch.ones(6), "token-mean", {}, "response_mask"),
    ],
)
def test_loss_normalizer_errors(mask: torch.Tensor, agg: str, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        loss_normalizer(mask, agg, **kwargs)


def _call(**overrides: object) -> None:
    args: dict[str, object] = {
        "logprobs": torch.zeros(2, 3), "old_logprobs": torch.zeros(2, 3), "advantages": torch.zeros(2),
        "mask": torch.ones(2, 3), "clip_low": 0.2, "clip_high": 0.28, "loss_agg": "token-mean",
        "normalizer": 6.0,
    }
    args.update(overrides)
    policy_loss(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"old_logprobs": torch.zeros(2, 4)}, "old_logprobs"),
        ({"advantages": torch.zeros(3)}, "advantages"),
        ({"advantages": torch.zeros(2, 3)}, "advantages"),
        ({"mask": torch.ones(3, 3)}, "mask"),
        ({"logprobs": torch.zeros(6)}, "logprobs"),
        ({"ref_logprobs": torch.zeros(1, 3)}, "ref_logprobs"),
        ({"rollout_logprobs": torch.zeros(2, 2), "tis_cap": 2.0}, "rollout_logprobs"),
        ({"kl_coef": 0.1}, "ref_logprobs"),
        ({"tis_cap": 2.0}, "rollout_logprobs"),
        ({"tis_cap": 0.0, "rollout_logprobs": torch.zeros(2, 3)}, "tis_cap"),
        ({"loss_agg": "mean"}, "loss_agg"),
        ({"loss_agg": "seq-mean-token-sum-norm"}, "max_response_len"),
        ({"normalizer": 0.0}, "normalizer"),
        ({"kl_coef": 0.1, "ref_logprobs": torch.zeros(2, 3), "kl_estimator": "k9"}, "k1"),
    ],
)
def test_policy_loss_errors(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _call(**overrides)
