"""A PNG of reward and phase times per step, drawn from the metrics log (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

PHASES = ["generate", "reward", "reference", "train", "weight_sync", "checkpoint"]


def plot_run(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Two panels: reward mean (and accuracy) per step; stacked seconds per phase per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    ax1.plot(steps, [r.get("reward/mean") for r in rows], marker="o", label="reward mean")
    if any("reward/accuracy_mean" in r for r in rows):
        ax1.plot(steps, [r.get("reward/accuracy_mean") for r in rows], marker=".", alpha=0.6, label="accuracy")
    ax1.set_ylabel("reward")
    ax1.grid(alpha=0.3)
    ax1.legend()
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        vals = [float(r.get(f"timing/{phase}_s") or 0.0) for r in rows]
        if any(vals):
            ax2.bar(steps, vals, bottom=bottom, label=phase)
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
