"""A PNG of reward, held-out eval and phase times per step, drawn from the metrics log (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

PHASES = ["generate", "reward", "reference", "train", "weight_sync", "checkpoint", "eval"]


def plot_run(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Panels: reward mean (and accuracy) per step; the held-out eval (eval/pass_at_k, eval/maj_at_k per eval
    step; only when the rows have eval/*); stacked seconds per phase per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/pass_at_1" in r]
    fig, axes = plt.subplots(3 if evals else 2, 1, figsize=(8, 10 if evals else 7), sharex=True)
    ax1, ax2 = axes[0], axes[-1]
    steps = [r["step"] for r in train]
    ax1.plot(steps, [r.get("reward/mean") for r in train], marker="o", label="reward mean")
    if any("reward/accuracy_mean" in r for r in train):
        ax1.plot(steps, [r.get("reward/accuracy_mean") for r in train], marker=".", alpha=0.6, label="accuracy")
    ax1.set_ylabel("reward")
    ax1.grid(alpha=0.3)
    ax1.legend()
    if evals:
        _eval_panel(axes[1], evals)
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        vals = [float(r.get(f"timing/{phase}_s") or 0.0) for r in rows]
        if any(vals):
            ax2.bar([r["step"] for r in rows], vals, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_xlabel("step")
    ax2.set_ylabel("seconds")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle(title or "GRPO run")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _eval_panel(ax, evals: list[dict]) -> None:
    """Every eval/pass_at_k and eval/maj_at_k curve of the eval rows (pass@1 first)."""
    steps = [r["step"] for r in evals]
    keys = sorted({k for r in evals for k in r if k.startswith(("eval/pass_at_", "eval/maj_at_"))},
                  key=lambda k: (k != "eval/pass_at_1", k))
    for key in keys:
        label = key[len("eval/"):].replace("_at_", "@")
        ax.plot(steps, [r.get(key) for r in evals], marker="s" if key == "eval/pass_at_1" else ".", label=label)
    ax.set_ylabel("held-out eval")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
