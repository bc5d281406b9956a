"""PPO's value model: a plain `Critic` class (torch + transformers) and its Ray actor `CriticActor`.

The critic is the policy's base model (its decoder: `AutoModelForCausalLM(...).get_decoder()`, the LM head
dropped) with a scalar value head `Linear(hidden, 1)` on the last hidden state, zero-initialised (the first
values are 0). Values are in the trainer's *shifted* coordinates (actors/model/forward.py): the value of
response token t is read at the position that predicts it, i.e. V_t is the value of the state before token t,
as GAE needs (orchestrator/algo/gae.py). Its own AdamW (`critic.lr`, linear warmup `critic.warmup_steps`, then
constant), gradient clipping, the non-finite update guard of the trainer (actors/trainer/finite.py), the
clipped value loss of PPO (orchestrator/algo/value_loss.py) aggregated like the policy loss (one normaliser
for the whole batch, so the update does not depend on `critic.micro_batch_size`). One process; with
`critic.num_workers = D > 1` the FSDP2-sharded `ShardedCritic` (actors/critic_sharded.py) overrides the
data-parallel hooks below (identities here), as the trainer's ranks do.

Checkpoint: `<folder>/value_model.safetensors` (weights) and `<folder>/critic_state.pt` (optimizer, scheduler,
step; read back with torch's safe loader), written atomically; orchestrator/critic_step.py puts the folder
at `<checkpoint>/critic/` before the manifest is written. A sharded critic's folder also holds `sharded/`
(DCP: weights and optimizer state, reshardable) and no optimizer in `critic_state.pt`; `load` reads either.
"""
from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Optional, Sequence

import ray
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from actors.model.data_parallel import SingleRank
from actors.memory_metrics import peak_memory_metrics
from actors.pinning import pin_from_env_count
from actors.trainer import finite
from actors.model.forward import (LOSS_MASK, MicroBatch, apply_loss_mask, autocast_context, collate,
                                  response_values, split_micro_batches)
from actors.model.fsdp import SHARDED_DIR, load_sharded
from actors.trainer.trainer import keep_fused
from orchestrator.algo import loss_normalizer, lr_multiplier, position_ids_from_attention_mask, response_mask_tensor
from orchestrator.algo.value_loss import clipped_value_loss, explained_variance_over
from orchestrator.utils.atomic import atomic_dir
from orchestrator.checkpoint.state import load_trainer_state

WEIGHTS_FILE, STATE_FILE = "value_model.safetensors", "critic_state.pt"


class ValueModel(torch.nn.Module):
    """A decoder body (HF base model, no LM head) and a zero-initialised `Linear(hidden, 1)` value head."""

    def __init__(self, body: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        # the decoder-layer classes FSDP2 wraps one by one (actors/model/fsdp.py:shard_model)
        self._no_split_modules = list(getattr(body, "_no_split_modules", None) or [])

    @classmethod
    def from_pretrained(cls, model_path: str) -> "ValueModel":
        """The body of the causal LM at `model_path` (fp32) and a fresh head. Raises as transformers does."""
        lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        return cls(lm.get_decoder(), lm.config.hidden_size)

    def values(self, mb: MicroBatch, precision: str = "fp32") -> torch.Tensor:
        """Values [b, L-1] float32 in shifted coordinates (position p: the state after input token p), 0 off
        `mb.mask`. Position ids from the attention mask (case C10); the head runs in fp32. Through `forward`
        (FSDP2 gathers the root unit's parameters, the head among them, in its forward hooks)."""
        device = self.head.weight.device
        v = self(mb.input_ids.to(device), mb.attention_mask.to(device),
                 position_ids_from_attention_mask(mb.attention_mask).to(device), precision)
        return torch.where(mb.mask.to(device), v, torch.zeros((), dtype=v.dtype, device=device))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                precision: str = "fp32") -> torch.Tensor:
        """Values [b, L-1] float32 of every position but the last (no mask applied)."""
        with autocast_context(precision, input_ids.device):
            out = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                            position_ids=position_ids)
        return self.head(out.last_hidden_state[:, :-1].float()).squeeze(-1)


class Critic(SingleRank):
    """Owns the value model, its optimizer and LR schedule, in one process (the data-parallel hooks: identities).

    Args:
        model_path: the policy's HF folder (its base model is the critic's body).
        critic_cfg: the `critic:` config section (lr, warmup_steps, weight_decay, grad_clip, micro_batch_size,
            updates_per_step).
        algo_cfg: the `algo` config (value_clip, loss_agg).
        precision: "fp32" or "bf16-autocast" (`trainer.precision`); max_new_tokens: `rollout.max_new_tokens`
            (the divisor of loss_agg=seq-mean-token-sum-norm); pad_id: the tokenizer's pad id;
            num_threads: torch threads (0 = the host's / pinned cores); seed: torch's seed.
    """

    def __init__(self, model_path: str, critic_cfg, algo_cfg, precision: str = "fp32", max_new_tokens: int = 1,
                 pad_id: int = 0, num_threads: int = 0, seed: int = 0):
        torch.set_num_threads(num_threads or pin_from_env_count())
        torch.manual_seed(seed)
        self.cfg, self.algo, self.precision = critic_cfg, algo_cfg, precision
        self.max_new_tokens, self.pad_id = max_new_tokens, pad_id
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = self._prepare_model(ValueModel.from_pretrained(str(model_path)).to(device))
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=critic_cfg.lr,
                                           weight_decay=critic_cfg.weight_decay)
        keep_fused(self.optimizer)  # torch's fused kernel where the parameters allow it
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(
            lr_multiplier, warmup_steps=critic_cfg.warmup_steps, total_steps=max(critic_cfg.warmup_steps, 1),
            min_lr_ratio=1.0))  # warmup, then constant
        self.step = 0  # optimizer steps taken

    def ready(self) -> bool:
        return True

    # ---- values ---------------------------------------------------------------------------------
    @torch.no_grad()
    def values(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """V_t of every response token, [B][len(response_i)] python floats, no gradient, in eval mode, in
        padded micro-batches of `critic.micro_batch_size`. Raises ValueError for an empty prompt or response."""
        return merge_values(len(prompt_ids), [self.local_values(prompt_ids, response_ids)])

    @torch.no_grad()
    def local_values(self, prompt_ids: Sequence[Sequence[int]],
                     response_ids: Sequence[Sequence[int]]) -> dict[int, list[float]]:
        """`values` of this rank's samples ({index: V [len(response_i)]}; one process: all of them). Collective
        with D ranks: every rank runs as many forwards (empty ones where its share is shorter)."""
        mine = self._mine(range(len(prompt_ids)))
        size = self.cfg.micro_batch_size
        chunks = [mine[s:s + size] for s in range(0, len(mine), size)]
        empty = self._empty_micro_batches(len(chunks))  # collective, before any forward
        self.model.eval()
        try:
            out: dict[int, list[float]] = {}
            for part in chunks:
                mb = collate([prompt_ids[i] for i in part], [response_ids[i] for i in part], pad_id=self.pad_id)
                out.update(zip(part, response_values(self.model.values(mb, self.precision), mb)))
            for _ in range(empty):
                self.model.values(self._dummy_micro_batch(), self.precision)
            return out
        finally:
            self.model.train()

    # ---- update ---------------------------------------------------------------------------------
    def update(self, prompt_ids: list[list[int]], response_ids: list[list[int]], returns: list[list[float]],
               old_values: list[list[float]], response_mask: Optional[list[list[int]]] = None) -> dict[str, float]:
        """`critic.updates_per_step` optimizer steps of the clipped value loss on the whole batch.

        Args: ids as the trainer's batch; `returns` (GAE's R = A + V_old) and `old_values` (the values R was
        computed with) [B][len(response_i)]; `response_mask` 1 on trained ids (multi-turn: 0 on observation
        ids), None = all. Returns `critic/value_loss`, `critic/vf_clip_frac`, `critic/explained_var` (of the
        first pass's values against the returns), `critic/values_mean`, `critic/grad_norm`, `critic/lr`,
        `critic/skipped_updates`, `timing/critic_update_s` (means over the optimizer steps; counts add up).
        """
        t0 = time.perf_counter()
        mask = response_mask_tensor(response_ids, response_mask)
        norm = loss_normalizer(mask, self.algo.loss_agg, max_response_len=self.max_new_tokens,
                               dp_size=self.dp_size)  # over the whole batch: D ranks' gradients are averaged
        per_token = {"ret": returns, "old": old_values}
        if response_mask is not None:
            per_token[LOSS_MASK] = response_mask
        mine = self._mine(range(len(prompt_ids)))  # this rank's samples (all of them with one process)
        groups = [[mine[j] for j in g] for g in split_micro_batches(
            [len(prompt_ids[i]) + len(response_ids[i]) for i in mine], self.cfg.micro_batch_size)[0]] if mine else []
        rows: list[dict[str, float]] = []
        for epoch in range(self.cfg.updates_per_step):
            rows.append(self._one_update(prompt_ids, response_ids, per_token, groups, norm, explain=epoch == 0))
        explained = rows[0].pop("critic/explained_var")  # of the values before any of this step's updates
        out = {k: sum(r[k] for r in rows) / (1 if k == "critic/skipped_updates" else len(rows)) for k in rows[0]}
        out["critic/explained_var"] = explained
        out["timing/critic_update_s"] = time.perf_counter() - t0
        out.update(peak_memory_metrics("critic"))
        return out

    def _one_update(self, prompt_ids, response_ids, per_token: dict, groups: list[list[int]], norm: float,
                    explain: bool) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        keys = ("critic/value_loss", "critic/vf_clip_frac", "critic/values_mean")
        sums = dict.fromkeys((*keys, "tokens", "loss", "nonfinite"), 0.0)
        seen: tuple[list, list] = ([], [])
        empty = self._empty_micro_batches(len(groups))  # collective, before any forward
        for pos in groups:
            mb = collate([prompt_ids[i] for i in pos], [response_ids[i] for i in pos],
                         {k: [v[i] for i in pos] for k, v in per_token.items()}, self.pad_id)
            mb = apply_loss_mask(mb)  # multi-turn: observation ids leave the loss
            v = self.model.values(mb, self.precision)
            dev = v.device
            ret, old, m = mb.values["ret"].to(dev), mb.values["old"].to(dev), mb.mask.to(dev)
            loss, metrics = clipped_value_loss(v, old, ret, m, self.algo.value_clip, self.algo.loss_agg, norm,
                                               self.max_new_tokens)
            loss.backward()  # also when not finite: D ranks join every backward; the update is then skipped
            n = metrics["critic/tokens"]
            for k in keys:
                sums[k] += metrics[k] * n
            sums["tokens"] += n
            sums["loss"] += float(loss.detach())
            sums["nonfinite"] += 0.0 if math.isfinite(float(loss.detach())) else 1.0
            if explain:
                seen[0].append(v.detach()[m])
                seen[1].append(ret[m])
        for _ in range(empty):  # D ranks run as many forward/backward passes
            (self.model.values(self._dummy_micro_batch(), self.precision).sum() * 0.0).backward()
        sums = self._reduce_sums(sums)  # summed over the ranks
        out = {k: sums[k] / max(sums["tokens"], 1.0) for k in keys}
        out["critic/loss"] = sums["loss"] / self.dp_size  # each rank's loss is D x its share (normaliser / D)
        if explain:
            vals, rets = (torch.cat(x) if x else torch.zeros(0) for x in seen)
            out["critic/explained_var"] = explained_variance_over(vals, rets, self._all_sum)
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        out["critic/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        out["critic/lr"] = self.scheduler.get_last_lr()[0]
        reason, _ = finite.guarded_step(self.optimizer, sums["nonfinite"] == 0, out["critic/grad_norm"], max_norm,
                                        self._all_max)
        if reason is None:
            self.scheduler.step()
            self.step += 1
        else:
            self.optimizer.zero_grad(set_to_none=True)
            if self.rank == 0:
                print(f"critic: update skipped at optimizer step {self.step}: non-finite {reason}", flush=True)
        out["critic/skipped_updates"] = float(reason is not None)
        return out

    # ---- data-parallel hooks: identities for one process; ShardedCritic (actors/critic_sharded.py) overrides them --
    def _prepare_model(self, model: ValueModel) -> ValueModel:
        return model

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        return sums

    def _dummy_micro_batch(self) -> MicroBatch:
        """One [1, 2] row of pad ids (the empty micro-batch of a rank with a shorter share)."""
        return collate([[self.pad_id]], [[self.pad_id]], pad_id=self.pad_id)

    # ---- checkpoints ------------------------------------------------------------------------------
    def save(self, folder: str) -> str:
        """Weights (`value_model.safetensors`) and optimizer, scheduler, step (`critic_state.pt`) into
        `folder`, atomically (a temporary folder renamed when complete). Returns the folder."""
        with atomic_dir(folder) as tmp:
            state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
            save_file(state, str(tmp / WEIGHTS_FILE))
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "step": self.step}, tmp / STATE_FILE)
        return str(Path(folder))

    def load(self, folder: str) -> int:
        """Restore weights, optimizer, scheduler and step from `save`'s `folder`; returns the step. Raises
        FileNotFoundError naming a missing file, CheckpointError for a file the safe loader refuses, and
        RuntimeError (torch) for weights of another shape."""
        folder = Path(folder)
        for name in (WEIGHTS_FILE, STATE_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder / name}: missing (the checkpoint holds no critic; "
                                        "algo.estimator=gae resumes only from a checkpoint of a gae run)")
        state = load_trainer_state(folder / STATE_FILE)
        if (folder / SHARDED_DIR).is_dir():  # a sharded critic's (any D): DCP reshards into this process
            load_sharded(self.model, self.optimizer, folder / SHARDED_DIR)
        else:
            self._load_full(load_file(str(folder / WEIGHTS_FILE)), state["optimizer"])
        keep_fused(self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        return self.step

    def _load_full(self, weights: dict[str, torch.Tensor], optimizer_state: dict) -> None:
        """Full weights and a single process's optimizer state dict (an unsharded checkpoint) into the model."""
        device = self.head_device()
        self.model.load_state_dict({k: v.to(device) for k, v in weights.items()})
        self.optimizer.load_state_dict(optimizer_state)

    def head_device(self) -> torch.device:
        return self.model.head.weight.device

    def get_step(self) -> int:
        return self.step

    def weights_checksum(self) -> float:
        """Sum of every weight (float64): a cheap fingerprint for tests of save / load and update."""
        return float(sum(p.detach().double().sum() for p in self.model.parameters()))


def merge_values(n: int, parts: list[dict[int, list[float]]]) -> list[list[float]]:
    """The ranks' `local_values` ({index: values}) as one list [n][len_i] in sample order. Raises ValueError
    when a sample is missing."""
    out: list = [None] * n
    for part in parts:
        for i, v in part.items():
            out[i] = v
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise ValueError(f"critic values: samples {missing[:8]} of {n} came from no rank")
    return out


@ray.remote
class CriticActor(Critic):
    """Ray actor over `Critic` (critic.num_workers=1: one per job, in its own placement bundle: orchestrator/placement/plan.py)."""
