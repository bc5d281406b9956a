"""Summary statistics, ratios and the markdown table of `benchmarks/vs_trl.py` (pure: no trl, ray, torch).

Input: per side, a list of repeats; each repeat a dict with `steps` (rows with `step`, `step_s`,
`generate_s`, `train_s`, `completion_tokens`, `prompt_tokens`, `reward_mean`), `peak_rss_bytes` and
`wall_s`. Timing statistics skip step 1 (warm-up: engine start, first compilation, allocator growth).
"""
from __future__ import annotations

import math
from statistics import mean

SPEED_TARGET = 2.0  # issue 7: >= 2x faster per step than TRL at equal reward
REWARD_TOLERANCE = 0.1  # ours may trail TRL's last-k reward by at most this and count as "equal reward"
# (binomial noise of 32k samples); higher is fine: the check guards against buying speed with learning


def repeat_stats(rep: dict, k: int) -> dict:
    """Statistics of one run. Raises ValueError when it has fewer than 2 steps (step 1 is excluded).

    s_per_step: mean step_s over steps 2..N; gen_tokens_per_s: completion tokens / generate seconds and
    train_tokens_per_s: (prompt + completion tokens) / train seconds, both summed over steps 2..N;
    reward_first_k / reward_last_k: mean reward of the first / last k steps (all steps counted).
    """
    steps = sorted(rep["steps"], key=lambda r: r["step"])
    if len(steps) < 2:
        raise ValueError(f"a run has {len(steps)} step(s): need >= 2 (step 1 is excluded from timings)")
    timed = steps[1:]
    k = max(1, min(k, len(steps)))
    gen_s = sum(r["generate_s"] for r in timed)
    train_s = sum(r["train_s"] for r in timed)
    return {
        "s_per_step": mean(r["step_s"] for r in timed),
        "step1_s": steps[0]["step_s"],
        "generate_s_per_step": gen_s / len(timed),
        "train_s_per_step": train_s / len(timed),
        "gen_tokens_per_s": sum(r["completion_tokens"] for r in timed) / gen_s if gen_s > 0 else math.nan,
        "train_tokens_per_s": (sum(r["prompt_tokens"] + r["completion_tokens"] for r in timed) / train_s
                               if train_s > 0 else math.nan),
        "completion_tokens_per_step": mean(r["completion_tokens"] for r in timed),
        "peak_rss_gib": rep["peak_rss_bytes"] / 2**30,
        "wall_s": rep["wall_s"],
        "reward_first_k": mean(r["reward_mean"] for r in steps[:k]),
        "reward_last_k": mean(r["reward_mean"] for r in steps[-k:]),
        "reward_curve": [r["reward_mean"] for r in steps],
    }


def side_stats(repeats: list[dict], k: int) -> dict:
    """Mean over repeats of each statistic (peak memory: the max); per-repeat values kept under `repeats`."""
    per = [repeat_stats(r, k) for r in repeats]
    out = {key: mean(p[key] for p in per) for key in per[0] if key != "reward_curve"}
    out["peak_rss_gib"] = max(p["peak_rss_gib"] for p in per)
    n = min(len(p["reward_curve"]) for p in per)
    out["reward_curve"] = [mean(p["reward_curve"][i] for p in per) for i in range(n)]
    out["repeats"] = per
    return out


def ratios(ours: dict, trl: dict) -> dict:
    """TRL / ours for times and memory (> 1: we are faster / smaller), ours / TRL for throughputs."""
    def div(a, b):
        return a / b if b else math.nan

    return {
        "speedup_s_per_step": div(trl["s_per_step"], ours["s_per_step"]),
        "gen_tokens_per_s": div(ours["gen_tokens_per_s"], trl["gen_tokens_per_s"]),
        "train_tokens_per_s": div(ours["train_tokens_per_s"], trl["train_tokens_per_s"]),
        "peak_rss": div(trl["peak_rss_gib"], ours["peak_rss_gib"]),
        "reward_last_k_diff": ours["reward_last_k"] - trl["reward_last_k"],
    }


def verdict(r: dict) -> str:
    """One line on the issue's target: speedup >= SPEED_TARGET at a reward at least TRL's: our last-k reward
    no more than REWARD_TOLERANCE below TRL's (higher is fine: "equal reward" guards against buying speed
    with learning)."""
    fast = r["speedup_s_per_step"] >= SPEED_TARGET
    d = r["reward_last_k_diff"]
    equal = d >= -REWARD_TOLERANCE
    where = "within" if abs(d) <= REWARD_TOLERANCE else ("above" if d > 0 else "below")
    return (f"target (>= {SPEED_TARGET:g}x faster per step at equal or better reward): speedup "
            f"{r['speedup_s_per_step']:.2f}x ({'met' if fast else 'NOT met'}), last-k reward difference {d:+.3f} "
            f"({where} +-{REWARD_TOLERANCE:g}: reward {'not worse' if equal else 'NOT matched'}); "
            f"{'both met' if fast and equal else 'NOT met'}")


def markdown_table(ours: dict, trl: dict, r: dict, k: int, trl_label: str) -> str:
    """The side-by-side table: one row per statistic, columns ours / TRL / ratio."""
    def f(x, d=2):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"

    rows = [
        ("seconds per step (mean of steps 2..N)", f(ours["s_per_step"]), f(trl["s_per_step"]),
         f"{f(r['speedup_s_per_step'])}x faster"),
        ("  of which generation s", f(ours["generate_s_per_step"]), f(trl["generate_s_per_step"]), ""),
        ("  of which training s", f(ours["train_s_per_step"]), f(trl["train_s_per_step"]), ""),
        ("step 1 seconds (warm-up, excluded)", f(ours["step1_s"]), f(trl["step1_s"]), ""),
        ("generation tokens/s", f(ours["gen_tokens_per_s"], 1), f(trl["gen_tokens_per_s"], 1),
         f"{f(r['gen_tokens_per_s'])}x"),
        ("training tokens/s (prompt + completion)", f(ours["train_tokens_per_s"], 1), f(trl["train_tokens_per_s"], 1),
         f"{f(r['train_tokens_per_s'])}x"),
        ("completion tokens per step", f(ours["completion_tokens_per_step"], 0),
         f(trl["completion_tokens_per_step"], 0), ""),
        ("peak RSS of the process tree, GiB", f(ours["peak_rss_gib"]), f(trl["peak_rss_gib"]),
         f"{f(r['peak_rss'])}x less"),
        ("process wall time, s (start-up included)", f(ours["wall_s"], 0), f(trl["wall_s"], 0), ""),
        (f"reward, mean of first {k} steps", f(ours["reward_first_k"], 3), f(trl["reward_first_k"], 3), ""),
        (f"reward, mean of last {k} steps", f(ours["reward_last_k"], 3), f(trl["reward_last_k"], 3),
         f"{r['reward_last_k_diff']:+.3f}"),
        ("reward per step", " ".join(f(x) for x in ours["reward_curve"]),
         " ".join(f(x) for x in trl["reward_curve"]), ""),
    ]
    head = f"| | rl-orchestrator | TRL GRPOTrainer ({trl_label}) | ratio |\n|---|---|---|---|\n"
    return head + "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
