"""`rl-orch plan memory`: bytes per GPU role, fits or not, and the changes that would make it fit.

    rl-orch plan memory --model llama3-8b --device-gib 24                  # full fine-tuning: does not fit
    rl-orch plan memory --model llama3-8b --device-gib 24 --lora-rank 16 --frozen-dtype bf16   # LoRA: fits
    rl-orch plan memory --layers 32 --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --vocab 128256
    rl-orch plan memory --config configs/grpo_arith_cpu.yaml trainer.micro_batch_size=4   # what pre-flight sees

Exit code 0 when every device fits, 1 when one does not, 2 on bad input (a message naming the option).
Formulas and their sources: orchestrator/memory/estimate.py.
"""
from __future__ import annotations

import argparse
import sys

from orchestrator.utils.finite import nonnegative_problem
from orchestrator.memory.estimate import DTYPE_BYTES, GIB, RunShape
from orchestrator.memory.params import PRESETS, ModelConfigError, resolve_model_config
from orchestrator.memory.planner import format_plan, plan_memory
from orchestrator.memory.shapes import ModelShape, model_shape, shape_from_numbers

_NUMBERS = ("layers", "hidden", "intermediate", "heads", "vocab")
_DEFAULTS: dict = {}  # option -> default, filled when the parser is built (to spot flags --config ignores)


def add_memory_parser(plan_sub: argparse._SubParsersAction) -> None:
    """Register `plan memory` beside `plan sync`."""
    p = plan_sub.add_parser("memory", help="bytes per GPU role, fits or not, and what would make it fit",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            description="Per-GPU memory plan: weights, gradients, optimizer states, activations, "
                                        "logits, KV cache of every role; fits or not; changes that would fit. "
                                        "Give --model, the model's numbers, or --config (a run's YAML, planned "
                                        "exactly as the run's pre-flight check plans it). Exit 0 = fits, 1 = does "
                                        "not fit, 2 = bad input.")
    p.add_argument("--model", help=f"preset ({', '.join(PRESETS)}), a config.json or a model folder")
    for name in _NUMBERS:
        p.add_argument(f"--{name}", type=int, help=f"model {name} (instead of --model)")
    p.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    p.add_argument("--experts", type=int, default=0, help="MoE experts per layer (0 = dense)")
    p.add_argument("--experts-per-token", type=int, default=2)
    p.add_argument("--config", help="a run's YAML config; the remaining arguments are key=value overrides")
    p.add_argument("overrides", nargs="*", help="with --config: key.path=value overrides")
    p.add_argument("--device-gib", type=float, help="memory of one device in GiB (default: 80, or with --config "
                                                    "memory.device_gib / the local GPU / host RAM)")
    p.add_argument("--algorithm", choices=("grpo", "ppo", "dpo"), default="grpo")
    p.add_argument("--cpu", action="store_true", help="a CPU run: every role shares the host's memory")
    p.add_argument("--precision", choices=("bf16-autocast", "fp32", "fp8"), default="bf16-autocast",
                   help="trainer precision; fp8: FP8 linear layers (torchao float8; GPUs of compute capability >= 8.9)")
    p.add_argument("--trainer-gpus", type=int, default=1, help="D trainer ranks, FSDP / ZeRO-3 shards")
    p.add_argument("--critic-gpus", type=int, default=0, help="--algorithm ppo: C critic ranks, FSDP shards "
                   "(critic.num_workers; full fine-tuning); 0 = a critic shaped like the trainer")
    p.add_argument("--context-parallel", type=int, default=1,
                   help="c: ranks each sequence is split over (ring attention, trainer.context_parallel_size; "
                        "divides --trainer-gpus)")
    p.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch")
    p.add_argument("--seq-len", type=int, default=512, help="prompt + response tokens per sequence")
    p.add_argument("--response-len", type=int, default=256, help="response tokens per sequence (logits)")
    p.add_argument("--packing-tokens", type=int, default=0, help="packed micro-batch rows of this many tokens")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0 = full fine-tuning)")
    p.add_argument("--frozen-dtype", choices=("bf16", "fp32"), default="fp32",
                   help="dtype of frozen copies: reference, reward model, LoRA base. fp32 is what rl-orch's "
                        "reference and LoRA trainer hold today; bf16 is what most other systems hold")
    p.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument("--offload", action="store_true", help="FSDP2 CPU offload of weights, grads, optimizer")
    p.add_argument("--reference", action="store_true", help="keep a reference model (KL > 0; always for DPO)")
    p.add_argument("--reward-model", help="a reward model (preset or config) held by a CPU actor")
    p.add_argument("--engines", type=int, default=1, help="vLLM engines")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of each engine")
    p.add_argument("--engine-dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--quantization", choices=("none", "fp8"), default="none",
                   help="engine weights: fp8 = vLLM FP8 linear layers (rollout.quantization; CUDA engines)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="engine KV cache: auto = "
                   "the engine dtype, fp8 = 1 byte (rollout.kv_cache_dtype; CUDA engines)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-gib", type=float, default=2.0, help="CPU runs: the engine's KV-cache space")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--colocate", action="store_true",
                   help="engines, the reference and the critic share the trainer GPUs (else GPUs of their own)")
    p.set_defaults(func=plan_memory_cmd)
    _DEFAULTS.update({a.dest: a.default for a in p._actions if a.dest not in ("help",)})


def _shape(args: argparse.Namespace) -> ModelShape:
    """ModelShape from --model or the numbers; ValueError naming the option."""
    given = [n for n in _NUMBERS if getattr(args, n) is not None]
    if args.model is not None:
        if given:
            raise ValueError(f"--model: give either --model or the numbers, not both (got --{given[0]})")
        try:
            return model_shape(resolve_model_config(args.model), name=args.model)
        except ModelConfigError as e:
            raise ValueError(f"--model: {e}") from None
    missing = [f"--{n}" for n in _NUMBERS if getattr(args, n) is None]
    if missing:
        raise ValueError(f"--model: give --model, --config, or all of {', '.join('--' + n for n in _NUMBERS)} "
                         f"(missing {', '.join(missing)})")
    try:
        return shape_from_numbers(args.layers, args.hidden, args.intermediate, args.heads, args.vocab,
                                  kv_heads=args.kv_heads, experts=args.experts,
                                  experts_per_token=args.experts_per_token)
    except ModelConfigError as e:
        raise ValueError(f"--{str(e).split(':')[0].replace('_', '-')}:{str(e).split(':', 1)[1]}") from None


def run_from_args(args: argparse.Namespace) -> RunShape:
    """The RunShape the options describe; ValueError naming the option when a number is out of range."""
    for opt in ("trainer_gpus", "micro_batch_size", "seq_len", "response_len", "engines", "tp", "max_model_len"):
        if getattr(args, opt) < (0 if opt == "engines" else 1):
            raise ValueError(f"--{opt.replace('_', '-')}: must be >= {0 if opt == 'engines' else 1} "
                             f"(got {getattr(args, opt)})")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization: must be in (0, 1] (got {args.gpu_memory_utilization})")
    if args.context_parallel < 1 or args.trainer_gpus % args.context_parallel:
        raise ValueError(f"--context-parallel: must be >= 1 and divide --trainer-gpus={args.trainer_gpus} "
                         f"(got {args.context_parallel})")
    if args.lora_rank < 0 or args.packing_tokens < 0:
        raise ValueError("--lora-rank / --packing-tokens: must be >= 0")
    if (why := nonnegative_problem(args.kv_cache_gib)) is not None:
        raise ValueError(f"--kv-cache-gib: {why}")
    if args.response_len > args.seq_len:
        raise ValueError(f"--response-len {args.response_len} exceeds --seq-len {args.seq_len} (prompt + response)")
    reward = None
    if args.reward_model:
        try:
            reward = model_shape(resolve_model_config(args.reward_model), name=args.reward_model)
        except ModelConfigError as e:
            raise ValueError(f"--reward-model: {e}") from None
    return RunShape(
        algorithm=args.algorithm, device="cpu" if args.cpu else "gpu", precision=args.precision,
        trainer_ranks=args.trainer_gpus, context_parallel=args.context_parallel, micro_batch_size=args.micro_batch_size, seq_len=args.seq_len,
        response_len=min(args.response_len, args.seq_len), packing_tokens=args.packing_tokens,
        gradient_checkpointing=args.grad_ckpt, attention=args.attention, lora_rank=args.lora_rank,
        offload=args.offload, frozen_bytes=DTYPE_BYTES[args.frozen_dtype], reference=args.reference,
        reward_model=reward, engines=args.engines, engine_tp=args.tp, engine_bytes=DTYPE_BYTES[args.engine_dtype],
        engine_fp8=args.quantization == "fp8", kv_cache_bytes=1 if args.kv_cache_dtype == "fp8" else 0,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len, critic_ranks=max(0, args.critic_gpus),
        colocated=("rollout", "reference", "critic") if args.colocate else ())


def _plan_config(args: argparse.Namespace):
    from orchestrator.config import ConfigError, load_config
    from orchestrator.memory.preflight import plan_for_config
    from orchestrator.utils.models import resolve_model_path

    ignored = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
               if k not in ("config", "overrides", "device_gib", "func", "command", "plan_command")
               and k in _DEFAULTS and v != _DEFAULTS[k]]
    if ignored:
        raise ValueError(f"--config: {', '.join(ignored)} would be ignored: with --config the run's YAML and its "
                         "key=value overrides describe the run (e.g. trainer.lora.rank=16 "
                         "trainer.micro_batch_size=4 model.path=...)")
    overrides = list(args.overrides)
    if args.device_gib is not None:
        overrides.append(f"memory.device_gib={args.device_gib}")
    try:
        cfg = load_config(args.config, overrides, plan_only=True)
        return plan_for_config(cfg, resolve_model_path(cfg.model.path, cfg.model.cache_dir))
    except (ConfigError, ModelConfigError, FileNotFoundError) as e:
        raise ValueError(f"--config: {e}") from None


def plan_memory_cmd(args: argparse.Namespace) -> int:
    """`rl-orch plan memory`: print the plan; 0 fits, 1 does not fit, 2 bad input (stderr names the option)."""
    try:
        if args.config:
            plan = _plan_config(args)
        else:
            if args.overrides:
                raise ValueError(f"overrides {args.overrides} need --config")
            if args.device_gib is not None and not 0 < args.device_gib < float("inf"):
                raise ValueError(f"--device-gib: must be a finite number > 0 (got {args.device_gib})")
            device = int((args.device_gib if args.device_gib is not None else 80.0) * GIB)
            plan = plan_memory(_shape(args), run_from_args(args), device)
    except ValueError as e:
        print(f"plan memory: {e}", file=sys.stderr)
        return 2
    print(format_plan(plan))
    return 0 if plan.fits else 1
