"""The training batch the controller hands to the trainer: one typed object instead of a dict of lists.

Every per-token field is a list per sample with one entry per response token (``len(response_ids[i])``),
as the rollout reports its logprobs; the trainer collates them into ``[B, T]`` tensors
(``response_mask_tensor`` and ``token_rows`` convert between the two forms). No Ray, no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass
class TrainBatch:
    """One global batch of trajectories to train on.

    Attributes:
        prompt_ids: ``[B][*]`` prompt token ids.
        response_ids: ``[B][*]`` response token ids (multi-turn: sampled and observation ids).
        rollout_logprobs: ``[B][len(response_i)]`` sampler logprobs of the response tokens (case C03).
        advantages: ``[B][len(response_i)]`` advantage per response token (``compute_token_advantages``;
            a per-sequence estimator repeats its value, 0 on untrained tokens).
        ref_logprobs: ``[B][len(response_i)]`` reference-model logprobs, or None (no KL).
        response_mask: ``[B][len(response_i)]`` 1 on trained ids, 0 on multi-turn observation / template
            ids; None = every response token is trained.

    Raises:
        ValueError: on construction, a field with another number of samples than ``prompt_ids``, or a
            per-token field whose sample ``i`` has another length than ``response_ids[i]`` (naming both).
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rollout_logprobs: list[list[float]]
    advantages: list[list[float]]
    ref_logprobs: Optional[list[list[float]]] = None
    response_mask: Optional[list[list[int]]] = None

    PER_TOKEN = ("rollout_logprobs", "advantages", "ref_logprobs", "response_mask")  # class constant, not a field

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        for name in ("response_ids", *self.PER_TOKEN):
            rows = getattr(self, name)
            if rows is not None and len(rows) != n:
                raise ValueError(f"TrainBatch.{name}: {len(rows)} samples, prompt_ids has {n}")
        for name in self.PER_TOKEN:
            rows = getattr(self, name)
            for i, (row, resp) in enumerate(zip(rows or (), self.response_ids)):
                if len(row) != len(resp):
                    raise ValueError(f"TrainBatch.{name}[{i}]: {len(row)} values for {len(resp)} response tokens")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @classmethod
    def with_sequence_advantages(cls, prompt_ids: list[list[int]], response_ids: list[list[int]],
                                 rollout_logprobs: list[list[float]], advantages: Sequence[float],
                                 ref_logprobs: Optional[list[list[float]]] = None,
                                 response_mask: Optional[list[list[int]]] = None) -> "TrainBatch":
        """A batch from one advantage per sample ``[B]``, repeated over its response tokens (0.0 where
        ``response_mask`` is 0): the per-token form a per-sequence estimator gives."""
        per_token = [[float(a)] * len(r) for a, r in zip(advantages, response_ids)]
        if response_mask is not None:
            per_token = [[a if keep else 0.0 for a, keep in zip(row, m)] for row, m in zip(per_token, response_mask)]
        if len(advantages) != len(prompt_ids):
            raise ValueError(f"TrainBatch.advantages: {len(advantages)} samples, prompt_ids has {len(prompt_ids)}")
        return cls(prompt_ids, response_ids, rollout_logprobs, per_token, ref_logprobs, response_mask)


def response_mask_tensor(response_ids: Sequence[Sequence[int]],
                         response_mask: Optional[Sequence[Sequence[int]]] = None) -> Tensor:
    """The ``[B, T]`` bool mask of trained response tokens, ``T`` the longest response (at least 1).

    Args:
        response_ids: ``[B][*]`` response ids (only their lengths are read).
        response_mask: ``[B][len(response_i)]`` 1 = trained, 0 = not (multi-turn observation ids); None = all.
    Raises:
        ValueError: a ``response_mask`` row whose length differs from its response's (naming the sample).
    """
    width = max((len(r) for r in response_ids), default=0)
    mask = torch.zeros(len(response_ids), max(width, 1), dtype=torch.bool)
    for i, r in enumerate(response_ids):
        if response_mask is None:
            mask[i, : len(r)] = True
            continue
        if len(response_mask[i]) != len(r):
            raise ValueError(f"response_mask[{i}]: {len(response_mask[i])} values for {len(r)} response tokens")
        mask[i, : len(r)] = torch.tensor([bool(v) for v in response_mask[i]], dtype=torch.bool)
    return mask


def token_rows(values: Tensor, response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
    """``[B, T]`` tensor -> ``[B][len(response_i)]`` python floats (the ``TrainBatch`` form)."""
    return [values[i, : len(r)].tolist() for i, r in enumerate(response_ids)]
