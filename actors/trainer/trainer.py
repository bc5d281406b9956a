"""The policy trainer: a plain `Trainer` class (torch + transformers) and its Ray actor `TrainerActor`.

One `train_step` takes the whole global batch of trajectories, splits it into mini-batches (one
optimizer step each) and micro-batches (gradient accumulation), and scales every micro-batch loss by
one normaliser computed for the whole mini-batch first (`loss_normalizer`, cases C01/C02), so the
update does not depend on the micro-batch size, nor on packing (`trainer.packing`: micro-batches are
rows of `micro_batch_tokens` tokens, first-fit decreasing, case C11). AdamW, linear warmup then cosine decay, gradient
clipping, fp32, bf16 autocast or FP8 linear layers (actors/trainer/fp8.py) with fp32 master weights. Optional gradient checkpointing, LoRA
adapters (actors/model/lora.py: merged weights for sync and `policy/`) and, for mixture-of-experts policies,
the router load-balancing loss over real tokens (actors/trainer/moe_loss.py, case C12).
"""
from __future__ import annotations

import functools
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import ray
import torch
from transformers import AutoModelForCausalLM

from actors.memory_metrics import peak_memory_metrics
from actors.pinning import pin_from_env_count
from actors.weight_sync.zero_copy import SharedTensors
from actors.model.data_parallel import SingleRank
from actors.model.forward import LOSS_MASK, collate_micro_batch, split_micro_batches
from actors.model.policy_forward import policy_forward
from actors.model import attention, lora, prefix_share
from actors.trainer import finite, fp8, warmup
from actors.trainer.moe_loss import RouterAux
from actors.trainer.update_size import update_ratio
from orchestrator.algo import LossInputs, Sampling, TrainBatch, compute_policy_loss, loss_normalizer, lr_multiplier
from orchestrator.algo.mismatch import uses_rollout_logprobs
from orchestrator.algo.mismatch_metrics import MismatchStats
from orchestrator.utils.atomic import atomic_dir
from orchestrator.checkpoint import write_manifest
from orchestrator.checkpoint.state import load_trainer_state, rng_state, set_rng_state
from orchestrator.weight_sync import group_checksums
from orchestrator.weight_sync.registry import entry_of

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


class Trainer(SingleRank):
    """Owns the policy, its optimizer and LR schedule. All methods run in one process."""

    def __init__(self, model_path: str, trainer_cfg, algo_cfg, temperature: Sampling, max_new_tokens: int,
                 pad_id: int = 0):
        self.cfg, self.algo, self.model_path = trainer_cfg, algo_cfg, str(model_path)
        self.temperature, self.max_new_tokens, self.pad_id = temperature, max_new_tokens, pad_id
        # Ray sets OMP_NUM_THREADS to the actor's (fractional -> 1) CPU count; use the host's cores.
        torch.set_num_threads(trainer_cfg.num_threads or pin_from_env_count())  # fake GPUs: pinned cores (actors/pinning.py)
        torch.manual_seed(trainer_cfg.seed)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.attn_implementation = attention.attn_implementation_for(trainer_cfg, trainer_cfg.packing)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                          **attention.load_kwargs(self.attn_implementation)).to(device)
        # the shared-prompt forward (prefix_share.enabled decides on first use; None = not decided yet)
        self.shared_prefix_on: Optional[bool] = None
        self.shared_prefix_layout = "auto"  # or "row" / "cache" (prefix_share.choose_layout; benchmarks set it)
        if self.attn_implementation == "flash_attention_2" and trainer_cfg.shared_prefix:
            self.shared_prefix_on = False  # its masked attention over the gathered prompt cache needs SDPA/eager
        if trainer_cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # LoRA layers injected in place (self.model stays the HF class); None = full fine-tuning
        self.peft = lora.apply_lora(self.model, trainer_cfg.lora)
        self.model = fp8.apply_fp8(self.model) if trainer_cfg.precision == "fp8" else self.model  # torchao Float8Linear
        self.router_aux = RouterAux.for_model(self.model, trainer_cfg.router_aux_loss_coef)  # None for dense models
        self.model.train()
        self.model = self._prepare_model(self.model)  # FSDP2 sharding with D > 1 (actors/trainer/sharded.py)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # fused: one kernel over all tensors (CPU and CUDA); 0.145 s against 0.678 s per step for the
        # default per-tensor loop on SmolLM2-135M, 2 CPU threads (benchmarks/optimizer_step.py, RESULTS.md)
        self.optimizer = torch.optim.AdamW(trainable, lr=trainer_cfg.lr, betas=tuple(trainer_cfg.betas),
                                           weight_decay=trainer_cfg.weight_decay, fused=_fused_ok(trainable))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule(trainer_cfg))
        self.step = 0  # optimizer steps taken
        self._senders: dict = {}

    # ---- training -------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update on a global batch (orchestrator/algo/batch.py: ids, and per response token the
        rollout logprobs, advantages, optional reference logprobs and loss mask). Returns `actor/*` and
        `timing/*` metrics. A mini-batch whose loss, gradient norm or updated weights are not finite is not
        applied (actors/trainer/finite.py: weights, optimizer state, LR schedule and `step` stay as they were);
        `actor/skipped_updates` counts them, `actor/skipped_trailing` those at the end of the step,
        `actor/nonfinite_{loss,grad_norm,weights}` say why.
        """
        t0 = time.perf_counter()
        n = len(batch)
        size = n // self.cfg.mini_batches
        old_all = None
        if self.cfg.mini_batches > 1 and self.algo.old_logprobs == "trainer":
            # the policy that sampled (= the weights before this step's first update): computed once,
            # so later mini-batches' ratios measure how far the earlier updates moved the policy
            old_all = self._old_logprobs(batch)
        metrics: dict[str, list[float]] = {}
        self.mismatch = MismatchStats(self.algo)  # rollout/mismatch_* over the whole step (orchestrator/algo)
        for m in range(self.cfg.mini_batches):
            idx = self._mini_batch_order(batch, range(m * size, (m + 1) * size))
            old = [old_all[i] for i in idx] if old_all is not None else None
            for k, v in self._mini_batch_update(batch, idx, old).items():
                metrics.setdefault(k, []).append(v)
        out = {k: sum(v) / (1 if k in finite.UPDATE_COUNTS else len(v)) for k, v in metrics.items()}  # counts add up
        out["actor/skipped_trailing"] = float(finite.trailing_skips(metrics["actor/skipped_updates"]))
        out.update(self.mismatch.finish(self._all_max))
        out["timing/train_s"] = time.perf_counter() - t0
        out.update(peak_memory_metrics("trainer"))
        return out

    def _mini_batch_order(self, batch, rows: range) -> list[int]:
        """The order in which a mini-batch's sequences fill micro-batches: sorted by length, so each padded
        micro-batch pads little (the global loss normaliser makes the order irrelevant to the update); with
        the shared-prompt forward, a group's samples side by side so its prompt runs once per micro-batch."""
        idx = sorted(rows, key=lambda i: len(batch.prompt_ids[i]) + len(batch.response_ids[i]))
        if prefix_share.enabled(self):
            idx = prefix_share.order_by_prompt(batch.prompt_ids, batch.response_ids, idx)
        return idx

    def _mini_batch_update(self, batch: TrainBatch, idx: list[int], old_lp: Optional[list]) -> dict[str, float]:
        resp_mask = torch.zeros(len(idx), max(len(batch.response_ids[i]) for i in idx), dtype=torch.bool)
        trained = batch.response_mask  # multi-turn: 0 on observation ids (never trained); None = all
        for j, i in enumerate(idx):
            resp_mask[j, : len(batch.response_ids[i])] = (torch.tensor(trained[i], dtype=torch.bool)
                                                          if trained is not None else True)
        norm = loss_normalizer(resp_mask, self.algo.loss_agg, max_response_len=self.max_new_tokens,
                               dp_size=self.dp_size)
        idx, old_lp = self._local_shard(idx, old_lp)  # this rank's part of the mini-batch (all of it when D = 1)
        if self.router_aux is not None:
            self.router_aux.start(sum(len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in idx))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        # padded groups of micro_batch_size, or packed rows of micro_batch_tokens (trainer.packing, case C11)
        groups, occupancy = split_micro_batches(
            [len(batch.prompt_ids[i]) + len(batch.response_ids[i]) for i in idx], self.cfg.micro_batch_size,
            _packing_budget(self.cfg))
        empty = self._empty_micro_batches(len(groups))  # D > 1 packed: the busiest rank's count minus ours
        for pos in groups:
            part = [idx[j] for j in pos]
            # advantages per response token [B][T], laid out (padded or packed) like the rollout logprobs
            per_token = {"rollout": [batch.rollout_logprobs[i] for i in part], "adv": [batch.advantages[i] for i in part]}
            if old_lp is not None:
                per_token["old"] = [old_lp[j] for j in pos]
            if batch.ref_logprobs is not None:
                per_token["ref"] = [batch.ref_logprobs[i] for i in part]
            if trained is not None:
                per_token[LOSS_MASK] = [trained[i] for i in part]
            prompts, responses = [batch.prompt_ids[i] for i in part], [batch.response_ids[i] for i in part]
            mb = collate_micro_batch(prompts, responses, self.cfg.packing, per_token, self.pad_id)
            for k, v in self._micro_batch_backward(mb, batch, part, norm).items():
                sums[k] = sums.get(k, 0.0) + v
        for _ in range(empty):  # every rank runs as many forward/backward passes (FSDP's collectives)
            self._empty_micro_batch()
        sums = self.mismatch.absorb(self._reduce_sums(sums))  # summed over data-parallel ranks
        tokens = max(sums.pop("actor/tokens"), 1.0)
        loss, nonfinite_loss = sums.pop("loss"), sums.pop("nonfinite_loss")  # summed over every rank
        out = {k: v / tokens for k, v in sums.items()}  # token-weighted means
        out["actor/loss"] = loss  # the mini-batch loss: micro-batch losses add up to it
        out["actor/token_occupancy"], out["actor/micro_batches"] = occupancy, float(len(groups))
        if self.router_aux is not None:
            out.update(self.router_aux.finish())
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")  # 0 = no clipping
        out["actor/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        out["actor/lr"] = self.scheduler.get_last_lr()[0]
        out.update(self._guarded_update(nonfinite_loss == 0, out, max_norm))
        return out

    def _guarded_update(self, loss_finite: bool, out: dict, max_norm: float) -> dict[str, float]:
        """The optimizer step unless the loss, the grad norm or the updated weights are non-finite
        (actors/trainer/finite.py); a skipped step leaves the schedule and `step` too. Returns its counts."""
        reason, copied = finite.guarded_step(self.optimizer, loss_finite, out["actor/grad_norm"], max_norm,
                                             self._all_max)
        ratio = update_ratio(self.optimizer, self._sum_shards) if reason is None else None  # before the LR moves
        if reason is None:
            self.scheduler.step()
            self.step += 1
        else:
            self.optimizer.zero_grad(set_to_none=True)  # the skipped gradients never reach a later update
            if self.rank == 0:
                print(f"trainer: update skipped at optimizer step {self.step}: non-finite {reason} (loss "
                      f"{out['actor/loss']}, grad norm {out['actor/grad_norm']}); weights and optimizer state "
                      "unchanged", flush=True)
        return finite.outcome_metrics(reason, copied) | ({} if ratio is None else {"actor/update_ratio": ratio})

    def _micro_batch_backward(self, mb, batch: TrainBatch, part: list[int], norm: float) -> dict[str, float]:
        router = [] if self.router_aux is not None else None  # MoE: per-layer router logits of this forward
        real_tokens_mask = mb.attention_mask
        # shared-prompt or plain forward, token entropy from its logits, packed rows per sequence, loss mask
        logprobs, entropy, mb = policy_forward(self, mb, [batch.prompt_ids[i] for i in part],
                                               [batch.response_ids[i] for i in part], router)
        device = logprobs.device
        mask = mb.mask.to(device)
        rollout = mb.values["rollout"].to(device)
        if self.algo.old_logprobs == "rollout":
            old = rollout
        else:
            old = mb.values["old"].to(device) if "old" in mb.values else logprobs.detach()
        inputs = LossInputs(logprobs, old, mb.values["adv"].to(device), mask, norm, self.max_new_tokens,
                            ref_logprobs=mb.values["ref"].to(device) if "ref" in mb.values else None,
                            rollout_logprobs=rollout if uses_rollout_logprobs(self.algo) else None,  # TIS, IcePop, MIS
                            entropy=entropy)
        loss, m = compute_policy_loss(inputs, self.algo)  # the registered `algo.policy_loss` (orchestrator/algo/loss.py)
        if self.router_aux is not None:  # router load-balancing loss over real tokens (case C12)
            loss = loss + self.router_aux.add(router, real_tokens_mask)
        loss.backward()  # also when not finite: FSDP ranks join every backward; the update is then skipped
        tokens = float(mask.sum())
        out = {k: v * tokens for k, v in m.items() if k != "actor/tokens"}
        out["loss"] = float(loss.detach())
        out["nonfinite_loss"] = 0.0 if math.isfinite(out["loss"]) else 1.0
        out.update(self.mismatch.micro_batch(old, logprobs.detach(), rollout, mask))  # sums: gap, rollout KL
        out["actor/tokens"] = tokens
        return out

    # ---- data-parallel hooks beyond SingleRank's (actors/model/data_parallel.py); ShardedTrainer overrides them --
    def _prepare_model(self, model):
        return model

    def _old_logprobs(self, batch: TrainBatch) -> list:
        """Response-token logprobs of every sample of `batch` under the current policy, [B][*]."""
        return prefix_share.trainer_batch_logprobs(self, batch.prompt_ids, batch.response_ids)

    def _local_shard(self, idx: list[int], old_lp: Optional[list]) -> tuple[list[int], Optional[list]]:
        return idx, old_lp

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        return sums

    def _empty_micro_batch(self) -> None:
        raise NotImplementedError("only data-parallel ranks (actors/trainer/sharded.py) run empty micro-batches")

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """Response-token logprobs under the current policy (no gradient), [B][len(response_i)]."""
        return prefix_share.trainer_batch_logprobs(self, prompt_ids, response_ids)  # shared prompts or plain

    def warm_up(self, prompt_len: int, response_len: int, group_size: int = 1) -> dict[str, float]:
        """Before step 1 (trainer.warm_up, CPU only): the largest micro-batch's forward/backward, the optimizer state."""
        return warmup.warm_up(self, prompt_len, response_len, group_size)

    def probe_logprobs(self, prompt_ids: list[int], continuation_ids: list[int], rows: bool = False):
        """The trainer's side of the weight-sync probe: `ProbeScores` (actors/model/forward.py `probe_scores`)."""
        from actors.model.forward import probe_scores

        return probe_scores(self.model, prompt_ids, continuation_ids, self.cfg.precision, self.pad_id, rows)

    def get_step(self) -> int:
        return self.step

    def optimizer_state(self) -> dict:
        """Read-only copy of the AdamW state, {"state": {param name: {"step", "exp_avg", "exp_avg_sq"}},
        "param_groups": [...]}, CPU tensors; the shape ShardedTrainer.optimizer_state gives (checks, tools)."""
        sd = self.optimizer.state_dict()
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]  # the optimizer's order
        state = {names[i]: {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in st.items()}
                 for i, st in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"]}

    # ---- weight export and checkpoints --------------------------------------------------------
    def weights_for_sync(self, dtype: str, device: str = "cpu") -> tuple[list[tuple[str, torch.Tensor]], dict]:
        """Named tensors (HF names, engine dtype, on `device`, contiguous) and {"groups": checksums, "bytes"}.

        A tied lm_head is left out: engines tie it to the embedding themselves. Tensors may alias the
        live parameters (same dtype and device): copy before the next optimizer step if kept.
        """
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        named = [(k, v.detach().to(device, _DTYPES[dtype]).contiguous())
                 for k, v in self._export_state().items() if not (tied and k == "lm_head.weight")]
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        expected = named + [("lm_head.weight", t) for k, t in named if tied and k == "model.embed_tokens.weight"]
        # SharedTensors: through the object store as raw buffers, not pickled bytes (actors/weight_sync/zero_copy.py)
        return SharedTensors(named), {"groups": group_checksums(expected), "bytes": nbytes}

    def _export_state(self, merge: bool = True) -> dict[str, torch.Tensor]:
        """The policy's state under HF names; with LoRA the merged weights (`merge=False`: same names and
        shapes, base tensors, nothing computed), see actors/model/lora.py."""
        return self.model.state_dict() if self.peft is None else lora.merged_state_dict(self.model, merge)

    def sync_size(self, dtype: str) -> tuple[int, int]:
        """(elements, bytes) one full weight sync moves in `dtype` (a tied head is not sent)."""
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        numel = sum(v.numel() for k, v in self._export_state(merge=False).items()
                    if not (tied and k == "lm_head.weight"))
        return numel, numel * torch.empty((), dtype=_DTYPES[dtype]).element_size()

    # ---- weight sync: every strategy's sender (actors/weight_sync/<strategy>.py), made at its setup ----
    def weight_sync(self, strategy, method: str, *args) -> Any:
        """Run `method` of `strategy`'s sender (a registry entry or a registered name; see
        actors/weight_sync/base.py): "setup" (SyncContext) makes a fresh sender over `weights_for_sync`
        in the context's dtype and returns its info; "send" (version, engine_versions) returns
        (payload, meta): call it with num_returns=2; "connect", "after_verified" as the base describes.
        Raises RuntimeError for a strategy not set up on this trainer."""
        entry = entry_of(strategy)
        if method == "setup":
            (ctx,) = args
            if entry.name in self._senders:  # a new syncer (an engine set re-formed): release the old group
                self._senders.pop(entry.name).close()
            self._senders[entry.name] = entry.load().sender(functools.partial(_weights_on, self, ctx.dtype))
        sender = self._senders.get(entry.name)
        if sender is None:
            raise RuntimeError(f"weight sync {entry.name!r}: {method} before setup on the trainer")
        return getattr(sender, method)(*args)

    def save_checkpoint(self, folder: str, extra: dict) -> str:
        """Write policy (HF safetensors folder with the tokenizer files; with LoRA the merged weights, and the
        adapter in `policy_adapter/`), optimizer, scheduler, RNG and `extra` state, then `manifest.json` last,
        atomically: into a temporary folder, every file and folder fsynced, renamed when complete. Returns
        the folder."""
        with atomic_dir(folder) as tmp:
            if self.peft is not None:  # policy/ = merged weights (engines load it on resume), adapter beside
                lora.save_merged(self.model, tmp / "policy")
                lora.save_adapter(self.peft, tmp / lora.ADAPTER_DIR)
            else:
                self.model.save_pretrained(tmp / "policy", safe_serialization=True)
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "step": self.step, "rng": rng_state()}, tmp / "trainer_state.pt")
            (tmp / "state.json").write_text(json.dumps(extra, indent=2))
            seal_checkpoint(tmp, self.model_path, extra.get("step", self.step))
        return str(Path(folder))

    def load_checkpoint(self, folder: str) -> dict:
        """Restore policy weights, optimizer, scheduler and RNG; return the checkpoint's extra state."""
        self.optimizer.state.clear()  # the warm-up's zeroed state: the checkpoint's replaces it, never both in memory
        if self.peft is not None:  # base weights = model.path, unchanged by LoRA training
            lora.load_adapter(self.peft, Path(folder) / lora.ADAPTER_DIR)
        else:
            lora.check_no_adapter(Path(folder))
            self.model.load_state_dict(  # the loaded copy is dropped before the optimizer state loads
                AutoModelForCausalLM.from_pretrained(Path(folder) / "policy", dtype=torch.float32).state_dict())
        state = load_trainer_state(Path(folder) / "trainer_state.pt")  # weights_only=True
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        else:  # written by FSDP2 ranks (trainer.num_workers > 1): model + optimizer in DCP files, any D
            from actors.model.fsdp import SHARDED_DIR, load_sharded
            load_sharded(self.model, self.optimizer, Path(folder) / SHARDED_DIR)
        keep_fused(self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        set_rng_state(state["rng"])
        return json.loads((Path(folder) / "state.json").read_text())


def lr_schedule(cfg) -> functools.partial:
    """LambdaLR's multiplier for `trainer` config `cfg`: warmup then cosine over total_steps x mini_batches
    optimizer steps. A partial of a module function, so the scheduler's state dict is plain data (loads with
    weights_only=True; a bound method of a Ray actor would carry its `inspect.Signature`)."""
    return functools.partial(lr_multiplier, warmup_steps=cfg.warmup_steps, total_steps=cfg.total_steps * cfg.mini_batches,
                             min_lr_ratio=cfg.min_lr_ratio)


def seal_checkpoint(folder: Path, model_path: str, step: int) -> None:
    """The last writes into a checkpoint's temporary folder: the tokenizer files beside the policy (the
    folder loads standalone), then `manifest.json` over every file (orchestrator/checkpoint/manifest.py)."""
    for f in Path(model_path).iterdir():
        if "token" in f.name or f.name in ("special_tokens_map.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy2(f, Path(folder) / "policy" / f.name)
    write_manifest(folder, step=step, base_model=model_path)


def _fused_ok(params: list) -> bool:
    """torch's fused AdamW takes float CPU and CUDA tensors (DTensors of FSDP2 too)."""
    return bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


def keep_fused(optimizer: torch.optim.Optimizer) -> None:
    """After `load_state_dict`: the saved param groups replace ours, and a checkpoint written before the
    trainer used the fused kernel says fused=None (the slow per-tensor loop); choose the kernel again."""
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = _fused_ok(group["params"]), None


def _packing_budget(cfg) -> Optional[int]:
    """Tokens per packed micro-batch row when `trainer.packing` is on, else None (padded micro-batches)."""
    return cfg.micro_batch_tokens if cfg.packing else None


def _weights_on(trainer: Trainer, dtype: str, device: str):
    return trainer.weights_for_sync(dtype, device)


@ray.remote
class TrainerActor(Trainer):
    """Ray actor over `Trainer`; call `weights_for_sync` with num_returns=2 (tensors, metadata)."""

    def ready(self) -> bool:
        return True
