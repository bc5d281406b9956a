"""The data-parallel base of the roles that train (the policy trainer, actors/trainer/trainer.py, and the PPO critic,
actors/critic.py): which samples of a batch a rank works on, and the collectives that make D ranks decide and report
as one process would. `SingleRank` is D = 1 (identities); `DataParallelRank` is one of D >= 2 FSDP2 ranks, rank 0
the leader that fans the controller's calls out to its peers (`RankLeader`). A role writes its step once, over
these hooks, and gets both:

    class Trainer(SingleRank): ...                           # the step, on `_mine`, `_all_max`, `_reduce_sums`, ...
    class ShardedTrainer(DataParallelRank, Trainer): ...     # D ranks: the hooks become collectives

Samples go to ranks round-robin, `i % dp_groups == dp_rank` (dp_groups = D / c with context parallelism of c ranks
per sequence, actors/model/context_parallel.py; D and the rank without it). The collectives run on `_device()`
(NCCL reduces CUDA tensors only; gloo on CPU): actors/model/collectives.py.
"""
from __future__ import annotations

import torch

from actors.model import collectives
from actors.model.leader import RankLeader


class SingleRank:
    """D = 1: every sample is this rank's, every reduction the identity."""

    rank, dp_size = 0, 1

    def _mine(self, indices) -> list[int]:
        """This rank's sample indices of a batch (all of them with one process)."""
        return list(indices)

    def _all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of `values` over the ranks."""
        return values

    def _all_max(self, values: list[float]) -> list[float]:
        """Element-wise max of `values` over the ranks (NaN wins): the update guard's shared decision
        (actors/trainer/finite.py)."""
        return values

    def _sum_shards(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums over the ranks of values computed on each rank's FSDP2 shards (actor/update_ratio's squares)."""
        return sums

    def _empty_micro_batches(self, count: int) -> int:
        """How many empty micro-batches to run after this rank's `count` real ones; 0 with one process."""
        return 0


class DataParallelRank(RankLeader, SingleRank):
    """One of D >= 2 ranks (see the module docstring). `_init_ranks` in the role's constructor, before its own;
    the role provides `_device()`."""

    dp_groups: int
    dp_rank: int

    def _init_ranks(self, role: str, rank: int, world_size: int, timeout_s: float, cp_size: int = 1) -> None:
        """Set rank, dp_size (D), dp_groups (D / cp_size), dp_rank, timeout_s and peers. Raises ValueError for D < 2
        or a rank outside [0, D)."""
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"{role}: rank {rank} of world_size {world_size} (needs world_size >= 2)")
        self.rank, self.dp_size, self.timeout_s, self.peers = rank, world_size, timeout_s, []
        self.dp_groups, self.dp_rank = world_size // cp_size, rank // cp_size

    def _device(self) -> torch.device:
        raise NotImplementedError

    def _mine(self, indices) -> list[int]:
        return [i for i in indices if i % self.dp_groups == self.dp_rank]

    def _all_sum(self, values: list[float]) -> list[float]:
        return collectives.all_sum(values, self._device())

    def _all_max(self, values: list[float]) -> list[float]:
        return collectives.all_max(values, self._device())

    def _sum_shards(self, sums: dict[str, float]) -> dict[str, float]:
        return collectives.all_sum_dict(sums, self._device())

    def _empty_micro_batches(self, count: int) -> int:
        """Collective (before any micro-batch of a mini-batch): the ranks' largest micro-batch count (all-reduce
        max) minus this rank's `count`; packed shards pack into different row counts."""
        return collectives.most(count, self._device()) - count
