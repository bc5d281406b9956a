"""`run.max_skipped_updates`: the trainer skips an update whose loss, gradient norm or updated weights are not
finite (actors/trainer/finite.py, metrics `actor/skipped_updates`, `actor/skipped_trailing`,
`actor/nonfinite_{loss,grad_norm,weights}`); this counts them over the run and stops it when too many come in a
row, with a message that says what was non-finite, at which steps, and what to do. Pure: no Ray, no torch.
"""
from __future__ import annotations

REASONS = ("loss", "grad_norm", "weights")


class DivergedError(RuntimeError):
    """`run.max_skipped_updates` optimizer updates in a row were skipped: the run cannot go on correctly."""


class SkippedUpdates:
    """Running count of skipped updates and of the current run of them.

    `max_in_a_row`: run.max_skipped_updates (0 = never stop); `updates_per_step`: trainer.mini_batches
    (optimizer updates a step attempts); `lr`: trainer.lr, named in the message."""

    def __init__(self, max_in_a_row: int, updates_per_step: int = 1, lr: float = 0.0):
        self.max_in_a_row, self.updates_per_step, self.lr = max_in_a_row, updates_per_step, lr
        self.total, self.in_a_row = 0, 0
        self.recent: list[tuple[int, str]] = []  # (step, what was non-finite) of the current run of skips

    def observe(self, step: int, row: dict) -> dict[str, float]:
        """Count the step's skips (`row` holds the trainer's metrics; no `actor/skipped_updates` = a step that
        did not train: nothing counted). Returns {"actor/skipped_updates_total", "actor/skipped_in_a_row"}.
        Raises DivergedError when the updates skipped in a row reach `max_in_a_row` (> 0)."""
        if "actor/skipped_updates" not in row:
            return {}
        skipped = int(row["actor/skipped_updates"] or 0)
        self.total += skipped
        trailing = int(row.get("actor/skipped_trailing", skipped) or 0)
        if skipped < self.updates_per_step:  # an update of this step was applied: the run of skips restarts
            self.in_a_row, self.recent = trailing, []
        else:
            self.in_a_row += skipped
        if skipped:
            self.recent.append((step, reasons(row)))
        if self.max_in_a_row and self.in_a_row >= self.max_in_a_row:
            raise DivergedError(self.message())
        return {"actor/skipped_updates_total": float(self.total), "actor/skipped_in_a_row": float(self.in_a_row)}

    def state_dict(self) -> dict:
        """What a checkpoint keeps, so that a resumed run counts on as the uninterrupted one would."""
        return {"total": self.total, "in_a_row": self.in_a_row, "recent": [list(r) for r in self.recent]}

    def load_state_dict(self, state: dict) -> None:
        self.total, self.in_a_row = int(state["total"]), int(state["in_a_row"])
        self.recent = [(int(s), str(why)) for s, why in state["recent"]]

    def message(self) -> str:
        where = "; ".join(f"step {s}: non-finite {why}" for s, why in self.recent)
        first = self.recent[0][0] if self.recent else "?"
        return (f"run.max_skipped_updates={self.max_in_a_row}: {self.in_a_row} optimizer updates in a row were skipped "
                f"because a value was not finite ({where}). The weights and optimizer state are still those of the "
                f"last good update, before step {first}. What to do: lower trainer.lr (now {self.lr:g}) or raise "
                "trainer.warmup_steps / lower trainer.grad_clip; check the rewards and the data of these steps "
                "(reward/*, rollout/* in metrics.jsonl); resume from the last checkpoint (checkpoint.resume=latest); "
                "or raise run.max_skipped_updates to let the run try longer.")


def reasons(row: dict) -> str:
    """What the trainer found non-finite in this step ("loss", "grad_norm", "weights", joined by '+')."""
    found = [r for r in REASONS if (row.get(f"actor/nonfinite_{r}") or 0) > 0]
    return "+".join(found) or "value"
