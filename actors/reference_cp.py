"""The reference model split like the trainer under context parallelism (`trainer.context_parallel_size` = c > 1
with `algo.kl_coef` > 0, issue 22): c `ContextParallelReferenceActor`s form a process group of their own, and every
micro-batch row (padded or packed) is split over them with the trainer's zig-zag split, attention running round
the ring (actors/model/context_parallel.py `cp_forward_logprobs`). A rank holds 1/c of each row's hidden states
and 1/c of its logits buffer, as the trainer's ranks do, so a sequence the trainer can train the reference can
score (orchestrator/memory/estimate.py counts the reference per rank the same way).

Rank 0 is the leader (actors/model/leader.py): the controller calls only its `logprobs`, which runs
`group_logprobs` on every rank at once (the ring is collective) and returns rank 0's result (the gather leaves the
whole [b, L-1] logprobs on every rank). The reference keeps a full copy of the weights on each rank (frozen, no
FSDP); the prompt-sharing forward (trainer.shared_prefix) is off, as it is for the trainer under context
parallelism. Limits: a rank that raises leaves the others waiting until `timeout_s` (run.phase_timeout_s), and
the supervisor then restarts the job (orchestrator/runtime/supervisor.py probes every rank).
"""
from __future__ import annotations

from typing import Optional

import ray

from actors.reference import Reference
from actors.model.context_parallel import RING_ATTENTION, cp_forward_logprobs
from actors.model.forward import batch_logprobs
from actors.model.fsdp import join_group
from actors.model.leader import RankLeader
from orchestrator.algo.sampler_support import Sampling


class ContextParallelReference(RankLeader, Reference):
    """One rank of a c-rank context-parallel reference; rank 0 (the leader) fans `logprobs` out to its peers.

    Arguments as `Reference`'s (shared_prefix and attn_implementation are fixed: off, the ring's) plus, keyword,
    `rank`, `world_size` (c >= 2), `group_name` (unique per job: the rendezvous key) and `timeout_s` (process
    group and peer-call timeout, seconds). Raises ValueError for a rank outside [0, c) or c < 2."""

    ROLE = "reference"

    def __init__(self, model_path: str, temperature: Sampling, micro_batch_size: int, precision: str = "fp32",
                 pad_id: int = 0, num_threads: int = 0, micro_batch_tokens: Optional[int] = None, *, rank: int,
                 world_size: int, group_name: str, timeout_s: float):
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"ContextParallelReference: rank {rank} of world_size {world_size} "
                             f"(needs world_size >= 2)")
        self.rank, self.dp_size, self.timeout_s = rank, world_size, timeout_s
        self.peers: list = []
        join_group(rank, world_size, group_name, timeout_s)
        super().__init__(model_path, temperature, micro_batch_size, precision, pad_id, num_threads,
                         micro_batch_tokens=micro_batch_tokens, shared_prefix=False)

    def _attn_implementation(self, requested: str, packing: bool, precision: str) -> str:
        return RING_ATTENTION

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """Rank 0: per-response-token logprobs [B][len(response_i)] (float), computed by the whole group.
        Raises RuntimeError off rank 0 or before `set_peers`, TimeoutError when a rank does not finish in time."""
        refs = self._fan_out("group_logprobs", prompt_ids, response_ids)
        mine = self.group_logprobs(prompt_ids, response_ids)
        self._collect(refs)
        return mine

    def group_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """This rank's part of `logprobs` (collective: every rank calls it with the same samples)."""
        return batch_logprobs(self.model, prompt_ids, response_ids, self.temperature, self.micro_batch_size,
                              self.precision, self.pad_id, micro_batch_tokens=self.micro_batch_tokens,
                              forward=cp_forward_logprobs)


@ray.remote
class ContextParallelReferenceActor(ContextParallelReference):
    """Ray actor over `ContextParallelReference`."""

    def ready(self) -> bool:
        return True
