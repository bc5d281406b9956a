"""A stateful prompt loader: epoch, position and seed are its whole state, so a resume is exact.

Each epoch visits every example once, in an order drawn from (seed, epoch). `state_dict()` after k
batches and `load_state_dict` on a fresh loader give the same next batches as the original.
"""
from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")


class StatefulLoader:
    """Yields batches of `batch_size` items; a batch may span an epoch boundary.

    Raises ValueError for an empty dataset or batch_size < 1.
    """

    def __init__(self, items: Sequence[T], batch_size: int, seed: int = 0, shuffle: bool = True):
        if not items:
            raise ValueError("the dataset is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.items, self.batch_size, self.seed, self.shuffle = list(items), batch_size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self) -> list[T]:
        out = []
        while len(out) < self.batch_size:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            out.append(self.items[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.items)}

    def load_state_dict(self, state: dict) -> None:
        """Restore (epoch, position, seed). Raises ValueError if the dataset size changed."""
        if state["size"] != len(self.items):
            raise ValueError(f"loader state was saved for {state['size']} examples, the dataset has "
                             f"{len(self.items)}: resuming would skip or repeat data")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._make_order()
