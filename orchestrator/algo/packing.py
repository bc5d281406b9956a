"""Sequence packing: fill micro-batch rows of a fixed token budget with whole sequences (pure, no torch
model code, no Ray).

The trainer packs the sequences of a mini-batch into rows of at most `trainer.micro_batch_tokens`
tokens instead of padding `micro_batch_size` sequences to the longest one. Position ids restart at 0 for
every sequence of a row; transformers reads those boundaries from the position ids and keeps attention
inside each sequence (case C11). Run the examples with ``pytest tests/unit/test_packing.py``::

    rows = pack_first_fit_decreasing([5, 3, 2, 4], budget=7)   # -> [[0, 2], [3, 1]]
    pos = packed_position_ids([4, 3])                          # -> [0, 1, 2, 3, 0, 1, 2]
"""
from __future__ import annotations

from typing import Sequence

import torch


def pack_first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bin-pack sequence lengths into rows of at most ``budget`` tokens, first-fit decreasing.

    Sequences are taken longest first (ties: lower index first) and each goes into the first row that
    still has room, else opens a new row. FFD uses at most 11/9 OPT + 6/9 rows (Dosa 2007, "The tight
    bound of first fit decreasing bin-packing algorithm is FFD(I) <= 11/9 OPT(I) + 6/9"). O(n * rows).

    Args:
        lengths: token count of each sequence (prompt + response), each an int >= 1.
        budget: tokens per row (``trainer.micro_batch_tokens``), an int >= 1.

    Returns:
        Rows as lists of indices into ``lengths``, in the order they were opened; inside a row, indices
        in the order placed (longest first). Every index appears exactly once. ``[]`` for no sequences.
        Example: lengths [5, 3, 2, 4], budget 7 -> [[0, 2], [3, 1]].

    Raises:
        ValueError: ``budget < 1``, a length < 1, or a sequence longer than ``budget`` (it cannot be
            split across rows: that would cut its attention context).
    """
    if budget < 1:
        raise ValueError(f"budget (trainer.micro_batch_tokens): must be >= 1, got {budget}")
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"lengths[{i}]: a sequence needs >= 1 token, got {n}")
        if n > budget:
            raise ValueError(f"sequence {i} has {n} tokens, more than the packing budget trainer.micro_batch_tokens="
                             f"{budget}; raise trainer.micro_batch_tokens to at least data.max_prompt_tokens + "
                             "rollout.max_new_tokens")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(budget - lengths[i])
    return rows


def packed_position_ids(lengths: Sequence[int]) -> torch.Tensor:
    """Position ids of sequences laid end to end: ``0 .. n_k - 1`` for each sequence k (case C11).

    Args:
        lengths: token count of each packed sequence, each >= 1.

    Returns:
        ``[sum(lengths)]`` int64, e.g. lengths [4, 3] -> [0, 1, 2, 3, 0, 1, 2].

    Raises:
        ValueError: a length < 1 (an empty sequence would merge its neighbours' boundaries).
    """
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"lengths[{i}]: a packed sequence needs >= 1 token, got {n}")
    if not lengths:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(n, dtype=torch.long) for n in lengths])


def token_occupancy(real_tokens: int, rows: int, budget: int) -> float:
    """Fraction of the token budget holding real tokens: ``real_tokens / (rows * budget)``, in [0, 1].

    For padded micro-batches pass ``rows * budget`` as the padded token count (``rows=1``,
    ``budget=sum(b_i * L_i)``). Raises ValueError when ``rows * budget <= 0`` or ``real_tokens`` is
    negative or exceeds the capacity.
    """
    capacity = rows * budget
    if capacity <= 0:
        raise ValueError(f"rows * budget: must be > 0, got {rows} * {budget}")
    if not 0 <= real_tokens <= capacity:
        raise ValueError(f"real_tokens: {real_tokens} is outside [0, rows * budget = {capacity}]")
    return real_tokens / capacity
