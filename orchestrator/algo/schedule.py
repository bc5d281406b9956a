"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

A pure function of the optimizer step, so that resuming from a checkpoint restores the learning rate
exactly (correctness case C09). Use it as the multiplier of ``torch.optim.lr_scheduler.LambdaLR``::

    scheduler = LambdaLR(optimizer, functools.partial(lr_multiplier, warmup_steps=10, total_steps=100))

Pure python; no Ray, no vLLM.
"""

from __future__ import annotations

import math


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate for the optimizer step that follows ``step`` taken steps.

    Indexing: ``step`` is the number of optimizer steps already taken (``LambdaLR``'s ``last_epoch``:
    0 at construction, +1 per ``scheduler.step()``), so the first update uses ``lr_multiplier(0)``.

        - ``step < warmup_steps``: ``step / warmup_steps`` (linear warmup; 0 at step 0).
        - ``warmup_steps <= step < total_steps``: with
          ``progress = (step - warmup_steps) / (total_steps - warmup_steps)``,
          ``min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * progress))``
          (cosine annealing, Loshchilov & Hutter 2017 "SGDR", eq. 5, one cycle without restarts).
        - ``step >= total_steps``: ``min_lr_ratio``.

    Case C09 (peak 1e-6, warmup 10, total 100): after 50 steps the lr is 1e-6 * 0.5 * (1 + cos(pi * 40/90))
    = 5.868241e-7, and 5.695866e-7 after 51.

    Args:
        step: optimizer steps already taken, >= 0.
        warmup_steps: steps of linear warmup, >= 0.
        total_steps: step at which the decay reaches ``min_lr_ratio``, >= ``warmup_steps`` and > 0.
        min_lr_ratio: final multiplier, in ``[0, 1]``.

    Returns:
        The multiplier as a python float in ``[0, 1]``.

    Raises:
        ValueError: negative ``step`` or ``warmup_steps``, ``total_steps`` < ``warmup_steps`` or <= 0,
            ``min_lr_ratio`` outside ``[0, 1]``.
    """
    if step < 0:
        raise ValueError(f"step: must be >= 0, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps: must be >= 0, got {warmup_steps}")
    if total_steps <= 0 or total_steps < warmup_steps:
        raise ValueError(f"total_steps: must be > 0 and >= warmup_steps ({warmup_steps}), got {total_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio: must be in [0, 1], got {min_lr_ratio}")
    if step < warmup_steps:
        return step / warmup_steps
    if step >= total_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
