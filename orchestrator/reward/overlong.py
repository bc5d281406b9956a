"""DAPO's two answers to over-long responses: a soft length penalty on the reward, and truncated samples
left out of the loss (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
section 3.4). Each is switched on by its own key; pure: trajectories and numbers in, numbers out.

Soft overlong punishment (eq. 13), `reward.overlong_penalty` {enabled, max_len = L_max, cache_len = L_cache,
factor}, added to the reward functions' total for a response of |y| tokens:

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

times `factor`. Metrics: reward/overlong_penalty_mean (mean of the added terms over the scored samples) and
reward/overlong_penalized_frac (the fraction with a non-zero term); reward/mean stays the reward functions' mean.

Overlong filtering, `algo.overlong_filter`: a truncated sample (finish_reason "length": cut at
rollout.max_new_tokens; multi-turn: max_turns / max_tokens) gets loss mask 0 on every response token, so it
leaves the loss (its reward still counts in its group's statistics). A trainer mini-batch whose samples are
all truncated would have no token to train on: its samples stay in the loss, counted in
rollout/overlong_unfiltered. Metric: rollout/overlong_filtered_frac (samples taken out / samples).
"""
from __future__ import annotations

from typing import Optional



def overlong_max_len(cfg) -> int:
    """L_max of run config `cfg`: reward.overlong_penalty.max_len, 0 = rollout.max_new_tokens."""
    return cfg.reward.overlong_penalty.max_len or cfg.rollout.max_new_tokens


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """R_length of DAPO eq. 13 for a response of `length` tokens: in [-1, 0]. Raises ValueError unless
    0 < cache_len <= max_len."""
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong penalty: need 0 < cache_len <= max_len, got cache_len={cache_len}, "
                         f"max_len={max_len}")
    start = max_len - cache_len
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / cache_len
    return -1.0


def add_overlong_penalty(rewards: list[float], trajs: list, cfg, row: dict) -> list[float]:
    """`rewards` [B] plus factor * R_length of each trajectory's response (`reward.overlong_penalty` of run config
    `cfg`); `rewards` itself, untouched, when the penalty is off. Writes the reward/overlong_* metrics into `row`."""
    op = cfg.reward.overlong_penalty
    if not op.enabled:
        return rewards
    terms = [op.factor * overlong_penalty(len(t.response_ids), overlong_max_len(cfg), op.cache_len) for t in trajs]
    row["reward/overlong_penalty_mean"] = sum(terms) / len(terms) if terms else 0.0
    row["reward/overlong_penalized_frac"] = sum(x != 0 for x in terms) / len(terms) if terms else 0.0
    return [float(r) + x for r, x in zip(rewards, terms)]


def is_truncated(traj) -> bool:
    """Whether a trajectory was cut, not finished: multi-turn by its stop reason (max_turns, max_tokens), else
    finish_reason "length" (rollout.max_new_tokens reached)."""
    if traj.multiturn is not None:
        return traj.multiturn.truncated
    return traj.finish_reason == "length"


def _filtered(trajs: list, mini_batches: int) -> tuple[list[bool], int]:
    """Per sample whether the filter takes it out, and the truncated samples kept (their whole mini-batch,
    rows [m * B // M, (m + 1) * B // M) as the trainer splits them, is truncated)."""
    cut = [is_truncated(t) for t in trajs]
    size = max(len(trajs) // max(mini_batches, 1), 1)
    kept = 0
    for start in range(0, len(trajs), size):
        if all(cut[start:start + size]):
            kept += len(cut[start:start + size])
            cut[start:start + size] = [False] * len(cut[start:start + size])
    return cut, kept


def overlong_filter_masks(trajs: list, masks: Optional[list[list[int]]], cfg) -> Optional[list[list[int]]]:
    """The loss masks [B][len(response_i)] with truncated samples zeroed when `algo.overlong_filter` is on;
    `masks` itself (None = every response token trained) when it is off."""
    if not cfg.algo.overlong_filter:
        return masks
    out, _ = _filtered(trajs, cfg.trainer.mini_batches)
    base = masks if masks is not None else [[1] * len(t.response_ids) for t in trajs]
    return [[0] * len(m) if drop else list(m) for m, drop in zip(base, out)]


def overlong_filter_metrics(trajs: list, cfg) -> dict:
    """{"rollout/overlong_filtered_frac", "rollout/overlong_unfiltered"} when `algo.overlong_filter` is on, else {}."""
    if not cfg.algo.overlong_filter or not trajs:
        return {}
    out, kept = _filtered(trajs, cfg.trainer.mini_batches)
    return {"rollout/overlong_filtered_frac": sum(out) / len(trajs), "rollout/overlong_unfiltered": kept}
