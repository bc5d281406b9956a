"""PPO's value model over D ranks with FSDP2: `critic.num_workers = D > 1` starts D `ShardedCriticActor`s, the way
`trainer.num_workers` shards the policy (actors/trainer/sharded.py; the same helpers: actors/model/fsdp.py,
collectives.py, leader.py).

- Process group: its own (the rendezvous key `rl_orch_fsdp_<group>` with a critic group name; torch's default
  group of each critic process, which is a process of its own apart from the trainer's ranks).
- Sharding: `fully_shard` per decoder layer, then the root (the value head, embeddings and final norm); every
  rank seeds `trainer.seed` and loads the same folder, the head is zero-initialised, so the ranks start equal.
- Values: each rank scores the samples `i % D == rank` in micro-batches of `critic.micro_batch_size` (a rank
  with fewer runs empty forwards, FSDP's collectives need as many on every rank); rank 0 merges the shares.
- Update: each rank trains on the samples `i % D == rank` of the whole batch with the loss normaliser of the
  whole batch and `dp_size = D` (FSDP averages gradients over the ranks), so the update and the metrics (sums
  all-reduced) equal the single critic's; gradient clipping uses the global norm; the non-finite guard
  decides alike on every rank. The batch need not split evenly at run time (empty micro-batches make up the
  difference); the config asks it to (orchestrator/config/critic.py) so that the ranks share the work.
- Checkpoint (`save` into `<ckpt>/critic/`): `sharded/` (DCP: weights and AdamW state, one file per rank,
  reshardable), `value_model.safetensors` (the full weights, gathered on rank 0) and `critic_state.pt`
  (scheduler, step, world size). `load` takes such a folder of any D, or a single critic's (full weights and
  its optimizer state keyed by parameter index, sharded on load); a single critic loads a sharded one too.

Rank 0 is the leader: the controller calls only it and it fans each call out to ranks 1..D-1 (`set_peers`).
Limits: those of the sharded trainer (a rank that raises leaves the others waiting until the group's timeout,
`run.phase_timeout_s`; each rank loads the full fp32 model once before sharding it).
"""
from __future__ import annotations

from pathlib import Path

import ray
import torch
from safetensors.torch import save_file

from actors.critic import STATE_FILE, WEIGHTS_FILE, Critic, ValueModel, merge_values
from actors.model import collectives
from actors.model.fsdp import SHARDED_DIR, full_state_dict, join_group, load_full_state, save_sharded, shard_model
from actors.model.data_parallel import DataParallelRank
from orchestrator.utils.atomic import atomic_dir


class ShardedCritic(DataParallelRank, Critic):
    """One rank of a D-rank FSDP2 critic; rank 0 (the leader) fans calls out to its peers.

    Extra constructor arguments (keyword): `rank`, `world_size` (D >= 2), `group_name` (unique per job: the
    rendezvous key) and `timeout_s` (process-group and peer-call timeout, seconds). Raises ValueError for a
    rank outside [0, D) or D < 2."""

    ROLE = "critic"

    def __init__(self, model_path: str, critic_cfg, algo_cfg, precision: str = "fp32", max_new_tokens: int = 1,
                 pad_id: int = 0, num_threads: int = 0, seed: int = 0, *, rank: int, world_size: int,
                 group_name: str, timeout_s: float):
        self._init_ranks("ShardedCritic", rank, world_size, timeout_s)
        self.group_name = group_name
        super().__init__(model_path, critic_cfg, algo_cfg, precision, max_new_tokens, pad_id, num_threads, seed)

    # ---- Critic hooks -------------------------------------------------------------------------------
    def _prepare_model(self, model: ValueModel) -> ValueModel:
        join_group(self.rank, self.dp_size, self.group_name, self.timeout_s)
        return shard_model(model, self.dp_size)

    def _device(self) -> torch.device:
        return self.head_device()  # NCCL reduces CUDA tensors only

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        return collectives.all_sum_dict(sums, self._device())

    def _load_full(self, weights: dict[str, torch.Tensor], optimizer_state: dict) -> None:
        load_full_state(self.model, self.optimizer, weights, optimizer_state)

    # ---- the leader's entry points (rank 0; the controller calls these) ---------------------------------
    def values(self, prompt_ids, response_ids) -> list[list[float]]:
        """`Critic.values` with each rank scoring its share; rank 0 returns them all in sample order."""
        refs = self._fan_out("local_values", prompt_ids, response_ids)
        mine = self.local_values(prompt_ids, response_ids)
        return merge_values(len(prompt_ids), [mine, *self._collect(refs)])

    def update(self, *args) -> dict[str, float]:
        """`Critic.update` on all D ranks, each on its share; rank 0's copy of the global metrics."""
        refs = self._fan_out("update_local", *args)
        out = Critic.update(self, *args)
        self._collect(refs)
        return out

    def save(self, folder: str) -> str:
        """`sharded/`, `value_model.safetensors` and `critic_state.pt` (module docstring) into `folder`, written
        into a temporary folder renamed when complete. Returns the folder."""
        with atomic_dir(folder) as tmp:
            refs = self._fan_out("join_save", str(tmp))
            self.join_save(str(tmp))
            self._collect(refs)
        return str(Path(folder))

    def load(self, folder: str) -> int:
        """Restore every rank from a sharded critic's folder (any D) or a single critic's; returns the step.
        Raises as `Critic.load`."""
        refs = self._fan_out("join_load", folder)
        step = self.join_load(folder)
        self._collect(refs)
        return step

    def weights_checksum(self) -> float:
        """Sum of every weight (float64) of the full model (gathered from all ranks)."""
        refs = self._fan_out("join_checksum")
        out = self.join_checksum()
        self._collect(refs)
        return out

    # ---- what every rank runs (rank 0 directly, the peers through the calls above) --------------------
    def update_local(self, *args) -> dict[str, float]:
        return Critic.update(self, *args)

    def join_save(self, folder: str) -> None:
        """Collective: the DCP files of this rank into `folder/sharded/`; rank 0 also writes the full weights
        and `critic_state.pt` (scheduler, step, world size) into `folder`."""
        folder = Path(folder)
        save_sharded(self.model, self.optimizer, folder / SHARDED_DIR)
        full = full_state_dict(self.model)
        if self.rank == 0:
            save_file({k: v.contiguous() for k, v in full.items()}, str(folder / WEIGHTS_FILE))
            torch.save({"scheduler": self.scheduler.state_dict(), "step": self.step, "world_size": self.dp_size},
                       folder / STATE_FILE)

    def join_load(self, folder: str) -> int:
        return Critic.load(self, folder)

    def join_checksum(self) -> float:
        """Collective: the full weights' sum on rank 0 (0.0 on the others)."""
        return float(sum(t.double().sum() for t in full_state_dict(self.model).values()))


@ray.remote
class ShardedCriticActor(ShardedCritic):
    """Ray actor over `ShardedCritic` (one per critic rank, each in its own placement bundle)."""
