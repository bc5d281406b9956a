"""Data-parallel policy training over D ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`).

`trainer.num_workers = D > 1` starts D `ShardedTrainerActor`s in one torch.distributed group (gloo on
CPU, NCCL on GPUs). Rank 0 is the leader: the controller and the weight-sync senders only talk to it,
and it fans each call out to ranks 1..D-1 (`set_peers`), so the controller and the sync code are the
same as with one trainer.

- Process group: rank 0 picks `<node ip>:<free port>` and publishes it in Ray's internal KV under the
  job's group name; every rank then joins `init_process_group` (timeout `timeout_s`).
- Sharding: every decoder layer (the model's `_no_split_modules` classes) and then the root are
  `fully_shard`ed over a 1-D device mesh; every rank seeds `trainer.seed` and loads the same HF folder,
  so the initial weights are equal. Parameters become DTensors; AdamW state is sharded with them.
- Training: each rank gets the whole global batch and trains on the samples `i % D == rank` of every
  mini-batch (mini-batch sizes are divisible by D, `orchestrator.config.load.validate`), so every rank
  runs the same number of forward/backward passes (FSDP's collectives need that). The loss normaliser
  is computed over the whole mini-batch with `dp_size=D` (`orchestrator.algo.loss_normalizer`): FSDP's
  reduce-scatter averages gradients over ranks, so each rank's loss is scaled by D and the update is the
  un-split batch's. Gradient clipping uses the global norm (`clip_grad_norm_` over DTensors). Metric
  sums are all-reduced, so every rank reports the global token-weighted means.
- Sequence packing (`trainer.packing`): each rank packs its own shard into rows of at most
  `trainer.micro_batch_tokens` tokens, so ranks may get different row counts. The ranks all-reduce
  (max) the count and a rank with fewer rows runs empty micro-batches: a forward/backward of one
  2-token dummy row whose loss is `0 * sum(logprobs)`, so it joins every FSDP collective and adds
  exactly 0 to the gradients; the normaliser stays the whole mini-batch's (cases C01/C02).
- LoRA (`trainer.lora.rank > 0`): peft injects the adapters before sharding, so each decoder layer's
  FSDP unit holds its frozen base weights and its trainable `lora_A` / `lora_B` (FSDP2 shards each
  parameter; only the adapters get gradients and AdamW state). The merged export gathers the full
  state dict (base + adapters) and folds the adapters in on rank 0 (`actors.model.lora.merged_state_dict`
  with `state=`), so the engines get `W + scaling * B @ A` as from a single trainer.
- Weight sync: all ranks join a full-state-dict gather (`get_model_state_dict(full_state_dict=True,
  cpu_offload=True)`); rank 0 gets the full tensors and returns them as the single trainer does.
- Checkpoints: all ranks join a torch.distributed.checkpoint (DCP) save of model + optimizer into
  `<ckpt>/sharded/` (one file per rank, reshardable to any D on load); rank 0 also writes the HF
  `policy/` folder (engines restart from it) and `trainer_state.pt` (scheduler, step, RNG), all inside
  the temporary folder that is renamed when complete (`Trainer.save_checkpoint`'s atomic scheme).
  A checkpoint of a single trainer (no `sharded/`) loads too: the full weights and optimizer state are
  sharded on load.

- Context parallelism (`trainer.context_parallel_size` = c > 1, actors/model/context_parallel.py): the D ranks
  form a (D // c, c) mesh; the c ranks of a row share every micro-batch of their data-parallel group's samples
  (`i % (D // c) == rank // c`), each running the decoder on its zig-zag part of each row with ring attention
  over the row's group; the logprobs (training, old-logprob and `logprobs` passes) are gathered over the group.
  FSDP2 still shards over all D ranks and averages over D with the normaliser's `dp_size = D`; the group's
  ranks' gradients add up to their micro-batch's gradient, so the update is the un-split batch's. The metric
  sums, which every rank of a group holds in full, are divided by c after the all-reduce.
- Non-finite updates (actors/trainer/finite.py): a non-finite loss on any rank's shard (its flag is summed
  with the metric sums), a non-finite global gradient norm, or non-finite weights after the step on any rank
  (`_all_max`) skip the update on every rank alike; each rank's shards and AdamW state stay as they were.

Limits: a rank that raises leaves the other ranks waiting in a collective until the group's timeout
(`run.phase_timeout_s`); the controller stops the run then.
Each rank loads the full fp32 model onto its device once before sharding it (fine up to ~7B on 80 GB
GPUs; larger needs meta-device init). With LoRA only linear target modules work on D > 1 ranks (checked
at start); the DCP `sharded/` files hold the frozen base weights too.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import ray
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from actors.model import collectives, lora
from actors.model.context_parallel import context_parallel_group, cp_forward_logprobs
from actors.model.forward import batch_logprobs, collate, forward_logprobs
from actors.model.fsdp import (FULL_CPU, SHARDED_DIR, full_state_dict, join_group, load_sharded, load_unsharded,
                               save_sharded, shard_model)
from actors.model.data_parallel import DataParallelRank
from actors.trainer.trainer import Trainer, keep_fused, seal_checkpoint
from orchestrator.algo import TrainBatch
from orchestrator.utils.atomic import atomic_dir
from orchestrator.checkpoint.state import load_trainer_state, rng_state, set_rng_state
from orchestrator.algo.sampler_support import Sampling

class ShardedTrainer(DataParallelRank, Trainer):
    """One rank of a D-rank FSDP2 trainer; rank 0 (the leader) fans calls out to its peers.

    Extra constructor arguments: `rank`, `world_size` (D >= 2), `group_name` (unique per job: the
    rendezvous key) and `timeout_s` (process-group and peer-call timeout, seconds).
    """

    def __init__(self, model_path: str, trainer_cfg, algo_cfg, temperature: Sampling, max_new_tokens: int,
                 pad_id: int = 0, *, rank: int, world_size: int, group_name: str, timeout_s: float):
        # context parallelism: c ranks share each sequence; samples are split over the D // c groups
        self.cp_size, self.cp_group, self._group_name = trainer_cfg.context_parallel_size, None, group_name
        self._init_ranks("ShardedTrainer", rank, world_size, timeout_s, self.cp_size)
        super().__init__(model_path, trainer_cfg, algo_cfg, temperature, max_new_tokens, pad_id)

    # ---- Trainer hooks ----------------------------------------------------------------------
    def _prepare_model(self, model):
        if self.peft is not None:  # the merge of gathered full tensors knows Linear LoRA layers only
            lora.check_linear_only(model)
        join_group(self.rank, self.dp_size, self._group_name, self.timeout_s)
        if self.cp_size > 1:  # the (dp, cp) mesh; the ring forward replaces the shared-prompt one
            self.cp_group = context_parallel_group(self.dp_size, self.cp_size, next(model.parameters()).device.type)
            self.shared_prefix_on = False
        return shard_model(model, self.dp_size)

    def _forward(self):
        """The no-gradient logprob forward: the context-parallel one over `cp_group` with c > 1, else plain."""
        return forward_logprobs if self.cp_group is None else functools.partial(cp_forward_logprobs, group=self.cp_group)

    def _old_logprobs(self, batch: TrainBatch) -> list:
        mine = self._mine(range(len(batch)))
        lps = batch_logprobs(self.model, [batch.prompt_ids[i] for i in mine],
                             [batch.response_ids[i] for i in mine], self.temperature,
                             self.cfg.micro_batch_size, self.cfg.precision, self.pad_id, forward=self._forward())
        out: list = [None] * len(batch)  # other ranks' samples: never read on this rank
        for i, lp in zip(mine, lps):
            out[i] = lp
        return out

    def _local_shard(self, idx, old_lp):
        keep = [j for j, i in enumerate(idx) if i % self.dp_groups == self.dp_rank]
        return [idx[j] for j in keep], ([old_lp[j] for j in keep] if old_lp is not None else None)

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        # the c ranks of a context-parallel group compute the same loss and metrics (of the whole micro-batch)
        out = {k: v / self.cp_size for k, v in collectives.all_sum_dict(sums, self._device()).items()}
        out["loss"] = out["loss"] / self.dp_size  # each rank's loss is D x its share (normaliser / D)
        return out

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device  # NCCL reduces CUDA tensors only

    def _empty_micro_batch(self) -> None:
        """One [1, 2] dummy row (pad ids) through the same forward, loss 0 * sum(logprobs), backward:
        every FSDP unit all-gathers and reduce-scatters as for a real row, every gradient gets exactly
        0 added, and no metric or token count changes."""
        mb = collate([[self.pad_id]], [[self.pad_id]], pad_id=self.pad_id)
        (forward_logprobs(self.model, mb, self.temperature, self.cfg.precision).sum() * 0.0).backward()

    def _export_state(self, merge: bool = True) -> dict[str, torch.Tensor]:
        """Collective when `merge`: the full state dict under HF names on rank 0 ({} elsewhere), with
        LoRA the merged weights. merge=False only sizes the tensors (the sharded DTensors report their
        global shapes; no collective)."""
        if not merge:
            return super()._export_state(merge=False)
        full = full_state_dict(self.model)
        return full if self.peft is None else lora.merged_state_dict(self.model, state=full)

    # ---- the leader's entry points (rank 0; the controller and the senders call these; RankLeader fans out) --
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """`Trainer.train_step` on all D ranks, each on its shard; returns the global metrics (rank 0's
        copy of the all-reduced sums, plus rank 0's `timing/train_s`)."""
        refs = self._fan_out("train_step_local", ray.put(batch))
        out = Trainer.train_step(self, batch)
        self._collect(refs)
        return out

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """Response-token logprobs [B][len(response_i)]: every rank runs the same forwards (FSDP
        gathers each layer from all ranks), rank 0 returns its result."""
        refs = self._fan_out("logprobs_local", prompt_ids, response_ids)
        out = self.logprobs_local(prompt_ids, response_ids)
        self._collect(refs)
        return out

    def probe_logprobs(self, prompt_ids: list[int], continuation_ids: list[int], rows: bool = False):
        """`Trainer.probe_logprobs` on every rank (FSDP gathers each layer), rank 0's result."""
        refs = self._fan_out("probe_logprobs_local", prompt_ids, continuation_ids)
        out = Trainer.probe_logprobs(self, prompt_ids, continuation_ids, rows)
        self._collect(refs)
        return out

    def weights_for_sync(self, dtype: str, device: str = "cpu"):
        """As `Trainer.weights_for_sync`, from the full state dict gathered from all ranks."""
        refs = self._fan_out("join_full_state")
        out = Trainer.weights_for_sync(self, dtype, device)
        self._collect(refs)
        return out

    def save_checkpoint(self, folder: str, extra: dict) -> str:
        """Write `sharded/` (DCP: model + optimizer, every rank), `policy/` (HF folder with the tokenizer
        files), `trainer_state.pt` (scheduler, step, RNG, world size), `state.json` and, last, `manifest.json`
        into a temporary folder, every file and folder fsynced, renamed when complete (a crash never leaves
        a half checkpoint). Returns the folder."""
        with atomic_dir(folder) as tmp:
            refs = self._fan_out("join_save", str(tmp))
            self.join_save(str(tmp))
            self._collect(refs)
            torch.save({"scheduler": self.scheduler.state_dict(), "step": self.step, "rng": rng_state(),
                        "world_size": self.dp_size}, tmp / "trainer_state.pt")
            (tmp / "state.json").write_text(json.dumps(extra, indent=2))
            seal_checkpoint(tmp, self.model_path, extra.get("step", self.step))
        return str(Path(folder))

    def load_checkpoint(self, folder: str) -> dict:
        """Restore weights, optimizer, scheduler, step and RNG on every rank from a sharded checkpoint
        (any D) or a single trainer's; returns the checkpoint's extra state (`state.json`)."""
        refs = self._fan_out("join_load", folder)
        self.join_load(folder)
        self._collect(refs)
        return json.loads((Path(folder) / "state.json").read_text())

    def optimizer_state(self) -> dict:
        """The full AdamW state {"state": {param name: {step, exp_avg, exp_avg_sq}}, "param_groups"}
        gathered from all ranks (CPU tensors), for checks and tools."""
        refs = self._fan_out("join_optimizer_state")
        out = self.join_optimizer_state()
        self._collect(refs)
        return out

    # ---- what every rank runs (rank 0 directly, the peers through the calls above) ------------
    def train_step_local(self, batch: TrainBatch) -> dict[str, float]:
        return Trainer.train_step(self, batch)

    def logprobs_local(self, prompt_ids, response_ids) -> list[list[float]]:
        if self.cp_group is None:
            return Trainer.logprobs(self, prompt_ids, response_ids)
        return batch_logprobs(self.model, prompt_ids, response_ids, self.temperature, self.cfg.micro_batch_size,
                              self.cfg.precision, self.pad_id, micro_batch_tokens=self.cfg.micro_batch_tokens if self.cfg.packing else None,
                              forward=self._forward())

    def probe_logprobs_local(self, prompt_ids, continuation_ids):
        return Trainer.probe_logprobs(self, prompt_ids, continuation_ids)

    def join_full_state(self) -> None:
        self._export_state(merge=True)

    def join_optimizer_state(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer, options=FULL_CPU)

    def join_save(self, tmp: str) -> None:
        save_sharded(self.model, self.optimizer, Path(tmp) / SHARDED_DIR)
        full = full_state_dict(self.model)
        if self.rank == 0 and self.peft is not None:  # policy/ = merged weights, the adapter beside it
            lora.save_merged(self.model, Path(tmp) / "policy", state=full)
            lora.save_adapter(self.peft, Path(tmp) / lora.ADAPTER_DIR, state=full)
        elif self.rank == 0:
            self.model.save_pretrained(Path(tmp) / "policy", state_dict=full, safe_serialization=True)

    def join_load(self, folder: str) -> None:
        folder = Path(folder)
        if (folder / SHARDED_DIR).is_dir():
            load_sharded(self.model, self.optimizer, folder / SHARDED_DIR)
        else:
            load_unsharded(self.model, self.optimizer, folder, self.peft)
        keep_fused(self.optimizer)
        state = load_trainer_state(folder / "trainer_state.pt")  # weights_only=True
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        set_rng_state(state["rng"])


@ray.remote
class ShardedTrainerActor(ShardedTrainer):
    """Ray actor over `ShardedTrainer`; call `weights_for_sync` with num_returns=2 (tensors, metadata)."""

    def ready(self) -> bool:
        return True
