"""The guarded optimizer step: a non-finite loss, gradient norm or updated weights skip the update, leaving
the weights, the optimizer state (and, in the caller, the LR schedule and step count) exactly as they were.

    reason = guarded_step(optimizer, loss_finite, grad_norm, max_grad_norm)   # None: applied
    # "loss" / "grad_norm": skipped before optimizer.step() (nothing touched)
    # "weights": the step made a weight or an optimizer-state value non-finite; restored bit for bit

Plain torch, no Ray; `Trainer._mini_batch_update` (actors/trainer/trainer.py) calls it after gradient clipping.
What it costs (the default model, SmolLM2-135M, fp32 AdamW; docs/trainer.md has the measurement):

1. The loss and the gradient norm are checked before the step: free (the norm is clip_grad_norm_'s, the loss
   flag rides along the metric sums the ranks already all-reduce).
2. A copy of the weights and the AdamW state (3x the fp32 weights) is made only when the step *could* overflow:
   with finite gradients, AdamW moves every element by at most lr * |m_hat| / eps (the denominator
   sqrt(v_hat) + eps is >= eps), so with P >= max|p| and M >= max|exp_avg| (the 2-norms of all weights and of
   all first moments, one fused pass each, `torch.nn.utils.get_total_norm`) and G the clipped gradient norm,
   |p_new| <= P |1 - lr wd| + lr (b1 M + (1 - b1) G) / ((1 - b1^t) eps)  (`adamw_bound`). Below a quarter of the dtype's largest value the step cannot
   make a weight non-finite, and no copy is made; an absurd lr (1e30, inf), exploding moments or weights near
   overflow take the copy. Other optimizers (or AdamW with amsgrad) always take it.
3. After the step, one fused pass checks the weights (`all_finite`: their 2-norm; an overflowing norm is
   confirmed element-wise). With a copy, the optimizer state is checked too and a failure restores both.
   A failure without a copy (the bound said it could not happen) raises FloatingPointError: nothing can be
   restored, the run stops before the weights reach an engine.

Data-parallel ranks (actors/trainer/sharded.py) pass `all_max`, an all-reduce (max) of a list of floats, so
that every rank takes the same decision: the gradient norm is already global, the loss flag is all-reduced
by the caller, P, M and the post-step flag go through `all_max`. Each rank copies and restores its own shards.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

SKIP_REASONS = ("loss", "grad_norm", "weights")  # the order in which they are checked
# per optimizer step (0 or 1); a train step with several mini-batches adds them up
UPDATE_COUNTS = ("actor/skipped_updates", *(f"actor/nonfinite_{r}" for r in SKIP_REASONS), "actor/update_copies")
AllMax = Callable[[list[float]], list[float]]


def _same(values: list[float]) -> list[float]:
    return values


def skip_reason(loss_finite: bool, grad_norm: float) -> Optional[str]:
    """What skips the update before the optimizer runs: "loss" (a micro-batch loss was NaN or +-inf on
    some rank), "grad_norm" (the global gradient norm is NaN or inf), or None."""
    if not loss_finite:
        return "loss"
    if not math.isfinite(grad_norm):
        return "grad_norm"
    return None


def outcome_metrics(reason: Optional[str], copied: bool) -> dict[str, float]:
    """The UPDATE_COUNTS of one optimizer step: skipped or not, which value was non-finite, whether a copy
    of the weights and state was taken."""
    out = {"actor/skipped_updates": float(reason is not None), "actor/update_copies": float(copied)}
    out.update({f"actor/nonfinite_{r}": float(reason == r) for r in SKIP_REASONS})
    return out


def trailing_skips(skipped: list[float]) -> int:
    """How many of a step's optimizer updates (0/1 flags in order) were skipped at its end, in a row."""
    n = 0
    for flag in reversed(skipped):
        if not flag:
            break
        n += 1
    return n


def guarded_step(optimizer: torch.optim.Optimizer, loss_finite: bool, grad_norm: float,
                 max_grad_norm: float = math.inf, all_max: AllMax = _same) -> tuple[Optional[str], bool]:
    """`optimizer.step()` unless something is non-finite. Returns (reason, copied): reason None when the
    update was applied, else one of SKIP_REASONS (weights and optimizer state then equal the ones before,
    bit for bit); copied True when a copy of the weights and state was taken (the step could overflow).
    The caller clears the gradients and leaves its LR scheduler and step count alone on a skip.

    Raises FloatingPointError when the weights are non-finite after a step that the bound said was safe
    (no copy to restore from: a bug in the optimizer or the bound; resume from the last checkpoint)."""
    reason = skip_reason(loss_finite, grad_norm)
    if reason is not None:
        return reason, False
    params = _params(optimizer)
    copy = None if step_is_safe(optimizer, min(grad_norm, max_grad_norm), all_max) else Snapshot(optimizer)
    optimizer.step()
    tensors = params + (_state_tensors(optimizer) if copy is not None else [])
    if all_max([0.0 if all_finite(tensors) else 1.0])[0] == 0.0:
        return None, copy is not None
    if copy is None:
        raise FloatingPointError("the optimizer step made a weight non-finite although its bound said it could not "
                                 "(actors/trainer/finite.py): the weights cannot be restored; resume from the last "
                                 "checkpoint (checkpoint.resume=latest) with a lower trainer.lr")
    copy.restore(optimizer)
    return "weights", True


def step_is_safe(optimizer: torch.optim.Optimizer, grad_norm: float, all_max: AllMax = _same) -> bool:
    """True when this AdamW step provably leaves every weight finite (`adamw_bound` below a quarter of the
    weights' largest value); False for any other optimizer, amsgrad, or non-finite inputs."""
    if type(optimizer) is not torch.optim.AdamW:
        return False
    groups = optimizer.param_groups
    if any(g.get("amsgrad") for g in groups):
        return False
    params = _params(optimizer)
    if not params:
        return True
    moments = [optimizer.state[p]["exp_avg"] for p in params if "exp_avg" in optimizer.state.get(p, {})]
    p_max, m_max = all_max([_max_norm(params), _max_norm(moments)])
    limit = min(torch.finfo(p.dtype).max for p in params) / 4
    # the smallest step count gives the smallest bias correction 1 - b1^t, the largest bound (no state yet: t = 1)
    t = min(float(optimizer.state[p]["step"]) if "step" in optimizer.state.get(p, {}) else 0.0 for p in params) + 1.0
    bound = max(adamw_bound(g, p_max, m_max, grad_norm, t) for g in groups)
    return all(math.isfinite(x) and x < limit for x in (p_max, m_max, grad_norm, bound))


def adamw_bound(group: dict, p_max: float, m_max: float, grad_norm: float, t: float) -> float:
    """Upper bound of |p| after AdamW step `t` (1-based) of `group` (lr, betas, eps, weight_decay), given
    p_max >= max|p|, m_max >= max|exp_avg| and grad_norm >= max|grad|:
    p_max |1 - lr wd| + lr (b1 m_max + (1 - b1) grad_norm) / ((1 - b1^t) eps)  (Loshchilov & Hutter 2019, alg. 2)."""
    lr, (b1, _), eps, wd = float(group["lr"]), group["betas"], float(group["eps"]), float(group["weight_decay"])
    m_new = b1 * m_max + (1.0 - b1) * grad_norm
    with_decay = p_max * abs(1.0 - lr * wd)
    if lr == 0.0 or m_new == 0.0:
        return with_decay
    return with_decay + lr * m_new / ((1.0 - b1 ** t) * eps)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """True when every element of every tensor is finite: one fused 2-norm pass (`get_total_norm`);
    only when a norm is not finite (a NaN, an inf, or a norm that overflowed) are the elements checked."""
    local = [local_shard(t) for t in tensors if t.numel()]
    if not local:
        return True
    if math.isfinite(float(torch.nn.utils.get_total_norm(local))):
        return True
    return all(bool(torch.isfinite(t).all()) for t in local)


class Snapshot:
    """A copy of an optimizer's parameters and its state (tensors cloned on their device), restored in place
    (`restore`), so parameters and state tensors keep their identity (FSDP2 DTensors included); state that
    did not exist at the copy (AdamW's lazy first step) is removed again."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.params = _params(optimizer)
        with torch.no_grad():
            self.values = [p.detach().clone() for p in self.params]
        self.state = {p: {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
                      for p in self.params if p in optimizer.state}

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for p, v in zip(self.params, self.values):
                p.copy_(v)
        for p in self.params:
            saved = self.state.get(p)
            if saved is None:
                optimizer.state.pop(p, None)
                continue
            current = optimizer.state[p]
            for k in [k for k in current if k not in saved]:
                del current[k]
            for k, v in saved.items():
                if torch.is_tensor(v) and torch.is_tensor(current.get(k)) and current[k].shape == v.shape:
                    current[k].copy_(v)
                else:
                    current[k] = v


def _params(optimizer: torch.optim.Optimizer) -> list:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for p in _params(optimizer) for v in optimizer.state.get(p, {}).values()
            if torch.is_tensor(v) and v.is_floating_point()]


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 DTensor (the tensor itself otherwise)."""
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t


def _max_norm(tensors: list[torch.Tensor]) -> float:
    """The 2-norm of all the tensors' elements together (>= their largest |element|), one fused pass
    (`get_total_norm`: foreach kernels); 0 for none; inf or NaN propagate."""
    local = [local_shard(t) for t in tensors if t.numel()]
    return float(torch.nn.utils.get_total_norm(local)) if local else 0.0
