"""Bytes of every resident copy of one role instance (pure arithmetic; no torch, no Ray).

Each function returns {component: bytes} for one instance (one trainer rank, one engine shard, ...).
Sources of the formulas:
- Model states: ZeRO (Rajbhandari et al. 2020, sec. 3.1): mixed-precision AdamW holds 16 bytes per
  trainable parameter (2 fp16 weights + 2 fp16 grads + 12 fp32 master weights, momentum, variance).
  Here `bf16-autocast` keeps fp32 parameters (the master copy) and fp32 gradients: 4 + 4 + 8 = 16 as
  well, plus the bf16 weight copies autocast casts for the matmuls and autograd keeps until backward.
  ZeRO-3 / FSDP full sharding divides all three by the D data-parallel ranks (sec. 5, P_os+g+p).
- Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation", sec. 4.1, eq. 1) counts
  the tensors autograd saves per layer and token; `layer_activation_bytes` redoes that count for the
  HF Llama decoder layer (RMSNorm, grouped-query attention with K/V repeated to all heads, SDPA or eager
  attention, SiLU-gated MLP, no dropout). Full recomputation (gradient checkpointing) keeps each layer's
  input and recomputes one layer at a time in backward (their sec. 4.2).
- KV cache: vLLM's paged attention (Kwon et al. 2023) with `gpu_memory_utilization` as the fraction of
  the device the engine may use (vLLM docs, "Engine arguments"); see `kv_cache_budget` and case C13.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.memory import longctx
from orchestrator.memory.shapes import DEFAULT_LORA_TARGETS, ModelShape

GIB = 1024 ** 3
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
# Per-process memory no tensor accounts for: CUDA context + cuBLAS workspace on a GPU (about 0.5 GiB
# on recent drivers), or the Python + torch + transformers import footprint (RSS) on a CPU host.
RUNTIME_BYTES = {"gpu": GIB // 2, "cpu": GIB // 2}


@dataclass(frozen=True)
class RunShape:
    """What a run keeps resident, the inputs of `plan_memory`. Sizes in tokens, fractions in [0, 1].

    algorithm: "grpo" (policy, optional reference, optional reward model, engines), "ppo" (adds a
    critic), "dpo" (policy and reference, no engines; a micro-batch is micro_batch_size pairs).
    precision: "fp32", "bf16-autocast" (fp32 master weights, bf16 compute) or "fp8" (bf16-autocast with the
    linear layers in FP8, see longctx.py). frozen_bytes: bytes per
    parameter of frozen copies (reference, reward model, LoRA base). seq_len: prompt + response tokens of
    a sequence; response_len: the tokens scored per sequence (the trainer projects only those to logits
    when `logits_all_positions` is False). packing_tokens > 0: micro-batches are rows of that many
    tokens instead of micro_batch_size sequences. micro_batches: micro-batches per optimizer step and
    rank (>= 2 means the gradients already exist while a micro-batch's activations are held).
    context_parallel: c ranks share each sequence (per-rank tokens divide by c, see longctx.py).
    colocated: roles that share each trainer GPU (the rest get GPUs of their own). device: "gpu" or
    "cpu" (on "cpu" every role shares the host's memory).
    """

    algorithm: str = "grpo"
    device: str = "gpu"
    precision: str = "bf16-autocast"
    trainer_ranks: int = 1
    context_parallel: int = 1  # c: ranks each sequence is split over (ring attention; orchestrator/memory/longctx.py)
    micro_batch_size: int = 1
    seq_len: int = 1024
    response_len: int = 512
    packing_tokens: int = 0
    gradient_checkpointing: bool = False
    attention: str = "sdpa"
    logits_all_positions: bool = False
    lora_rank: int = 0
    lora_targets: tuple = DEFAULT_LORA_TARGETS
    offload: bool = False
    frozen_bytes: int = 2
    reference: bool = False
    reward_model: Optional[ModelShape] = None
    engines: int = 1
    engine_tp: int = 1
    engine_bytes: int = 2
    engine_fp8: bool = False  # rollout.quantization=fp8: the linear layers' weights at 1 byte (longctx.py)
    kv_cache_bytes: int = 0  # bytes of a K/V element: 1 = rollout.kv_cache_dtype=fp8, 0 = engine_bytes
    gpu_memory_utilization: float = 0.9
    kv_cache_gib: float = 0.0
    max_model_len: int = 4096
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    colocated: tuple = field(default_factory=tuple)
    # PPO's critic as the run starts it (algo.estimator=gae, actors/critic.py): critic_ranks > 0 processes of
    # full fine-tuning (no LoRA, no packing) in micro-batches of critic_micro_batch_size; 0 = like the trainer
    critic_ranks: int = 0
    critic_micro_batch_size: int = 0


def micro_batch_tokens(run: RunShape) -> int:
    """Tokens of one micro-batch: packing_tokens, else micro_batch_size * seq_len (x2 for DPO pairs)."""
    if run.packing_tokens > 0:
        return run.packing_tokens
    return run.micro_batch_size * run.seq_len * (2 if run.algorithm == "dpo" else 1)


def scored_tokens(run: RunShape) -> int:
    """Tokens projected to logits per micro-batch: every position, or the response positions only."""
    tokens = micro_batch_tokens(run)
    if run.logits_all_positions:
        return tokens
    per_seq = max(1, run.seq_len)
    return max(1, tokens * min(run.response_len, per_seq) // per_seq)


def rank_tokens(run: RunShape) -> tuple[int, int]:
    """(tokens, scored tokens) of one micro-batch on one trainer rank: divided by c under context
    parallelism (each rank holds one chunk of every sequence)."""
    return longctx.cp_split(micro_batch_tokens(run), run), longctx.cp_split(scored_tokens(run), run)


def layer_activation_bytes(model: ModelShape, precision: str, attention: str, seq_len: int) -> int:
    """Bytes autograd saves per token in one HF Llama-style decoder layer (Korthikanti et al. 2022,
    eq. 1, recounted for this layer and checked tensor by tensor with saved-tensor hooks). Per token:
      2 RMSNorms: the fp32 residual input and the normalised x (4h + 4h each)              16h
      projection inputs: fp32 one shared norm output per norm (4h + 4h); bf16-autocast casts
        the input once per projection (q, k, v, gate, up: 5 x 2h)                            8h | 10h
      attention: q, K and V repeated to all heads, the SDPA output (o_proj reads it in place)  4h e
      MLP: gate and up outputs, SiLU output, their product (down_proj's input)                4I e
      SDPA: the logsumexp (heads x 4) and the padding mask cast to the compute dtype (seq x e);
      eager instead: the fp32 softmax probabilities (heads x seq x 4), + their bf16 cast under autocast
      MoE (approximate): per routed expert a token uses 4 I_expert e + the gathered input h e,
      plus the router logits (experts x 4)
    with e = 4 bytes (fp32) or 2 (bf16-autocast, fp8), and 2 fp32 RMSNorm scales (8 bytes). fp8: as bf16-autocast
    (torchao's float8 training saves bf16 inputs; the trainer's recipe, actors/trainer/fp8.py). seq_len: the keys a query
    spans at once (seq / c under context parallelism: ring attention takes one block at a time).
    """
    h, e = model.hidden, (4 if precision == "fp32" else 2)
    if model.experts:
        mlp = model.experts_per_token * (4 * model.moe_intermediate + h) * e + 4 * model.experts
    else:
        mlp = 4 * model.intermediate * e
    per_token = 16 * h + (8 * h if e == 4 else 10 * h) + 4 * h * e + mlp + 8
    if attention == "eager":
        per_token += model.heads * seq_len * (4 if e == 4 else 6)
    else:
        per_token += model.heads * 4 + seq_len * e
    # fp8: the trainer's recipe is torchao's float8 training (actors/trainer/fp8.py), which saves the linear layers'
    # inputs at the compute dtype (bf16), so activations are bf16-autocast's; only the weight copies shrink (below).
    # (Transformer Engine's recipe saves 1-byte inputs: longctx.fp8_linear_input_saving.)
    return per_token


def activation_bytes(model: ModelShape, run: RunShape) -> int:
    """Activation bytes held at the end of one micro-batch's forward (layers + final norm + head input).

    Without checkpointing: layers * tokens * per-layer bytes. With it: each layer's fp32 input
    (tokens * h * 4) plus one layer recomputed in backward (Korthikanti et al. 2022, sec. 4.2).
    The final RMSNorm keeps 8h bytes a token; the LM head keeps its input for the scored tokens.
    Context parallelism: tokens, scored tokens and the key span per rank divide by c.
    """
    tokens, scored = rank_tokens(run)
    per_layer = layer_activation_bytes(model, run.precision, run.attention, longctx.cp_split(run.seq_len, run))
    if run.gradient_checkpointing:
        layers = model.layers * tokens * model.hidden * 4 + tokens * per_layer
    else:
        layers = model.layers * tokens * per_layer
    compute = 4 if run.precision == "fp32" else 2
    return layers + tokens * 8 * model.hidden + scored * model.hidden * compute


def logits_bytes(model: ModelShape, run: RunShape) -> int:
    """Peak of the logits buffer (vocabulary x scored tokens): the fp32 logits / temperature kept for
    logsumexp, and in backward the exp, the gather and logsumexp gradients and their sum (4 fp32
    [N, V] buffers at once; orchestrator.algo.token_logprobs). Per rank: N / c under context parallelism."""
    return 4 * 4 * rank_tokens(run)[1] * model.vocab


def trainer_bytes(model: ModelShape, run: RunShape) -> dict[str, int]:
    """One trainer rank (or PPO critic rank): weights, grads, optimizer, activations, logits, runtime.

    Full fine-tuning: 4 bytes of fp32 weights, 4 of fp32 grads, 8 of AdamW moments per parameter,
    divided by D = trainer_ranks (ZeRO-3 / FSDP). LoRA: the base weights frozen at frozen_bytes, the
    adapters trained (Hu et al. 2021). bf16-autocast adds bf16 copies of fp32 weights the matmuls use
    (all of them with D = 1; two layers all-gathered at a time under FSDP). Offload (FSDP2
    CPUOffloadPolicy) moves weights, grads and optimizer states to host memory. The optimizer step
    needs temporaries: one fp32 copy of the trainable parameters (foreach AdamW on a GPU) or two of the
    largest tensor (per-tensor AdamW on a CPU); peak = model states + max(activation phase, optimizer step).
    """
    d = max(1, run.trainer_ranks)
    trainable = model.lora_params(run.lora_rank, run.lora_targets) if run.lora_rank else model.num_params
    base_bytes = run.frozen_bytes if run.lora_rank else 4
    weights = (model.num_params * base_bytes + (trainable * 4 if run.lora_rank else 0)) // d
    grads, optimizer = trainable * 4 // d, trainable * 8 // d
    compute, fp8 = (4 if run.precision == "fp32" else 2), run.precision == "fp8"
    copies = 0
    if d > 1 or run.offload:  # FSDP: the current and the prefetched layer all-gathered in compute dtype
        copies = longctx.weight_copy_bytes(model, compute, fp8, layers_held=2)
    elif compute == 2 and base_bytes == 4:  # autocast's bf16 (fp8: FP8 linear) weight copies, saved for backward
        copies = longctx.weight_copy_bytes(model, 2, fp8)
    if run.offload:
        weights = grads = optimizer = 0
    acts, logits = activation_bytes(model, run), logits_bytes(model, run)
    acts += longctx.ring_kv_bytes(model, micro_batch_tokens(run), run, compute)
    if run.offload:
        step_temp = 0
    elif run.device == "gpu":
        step_temp = trainable * 4 // d
    else:
        step_temp = 2 * 4 * min(trainable, model.largest_param)
    # the optimizer step's temporaries show as "other" where they exceed the activation phase
    other = max(0, step_temp - (copies + acts + logits))
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": acts + copies,
            "logits": logits, "kv_cache": 0, "other": other, "runtime": RUNTIME_BYTES[run.device]}


def critic_bytes(model: ModelShape, run: RunShape) -> dict[str, int]:
    """PPO critic rank: the trainer's states and activations with a value head instead of the LM head
    (no logits buffer)."""
    out = trainer_bytes(model, run)
    out["logits"] = 0
    return out


def frozen_forward_bytes(model: ModelShape, run: RunShape, split: bool = False) -> dict[str, int]:
    """A frozen copy scoring micro-batches without gradients (reference model, reward model): weights at
    frozen_bytes, the largest transient of a no-grad forward (a few [tokens, intermediate] buffers)
    and the logits / logsumexp buffers (2 fp32 [N, V]). split: one of c context-parallel ranks (the GRPO
    reference under trainer.context_parallel_size, actors/reference_cp.py: tokens divide by c, every rank holds
    all the weights); otherwise whole micro-batches (a reward model, the DPO reference)."""
    tokens, scored = rank_tokens(run) if split else (micro_batch_tokens(run), scored_tokens(run))
    width = max(model.intermediate, model.moe_intermediate * max(1, model.experts_per_token))
    transient = tokens * (2 * model.hidden + 3 * width) * 4
    return {"weights": model.num_params * run.frozen_bytes, "grads": 0, "optimizer": 0, "activations": transient,
            "logits": 2 * 4 * scored * model.vocab, "kv_cache": 0, "other": 0,
            "runtime": RUNTIME_BYTES[run.device]}


def engine_peak_bytes(model: ModelShape, run: RunShape) -> int:
    """vLLM's non-KV peak per GPU (approximate): its weights / tp plus the profiling forward's activations
    (max_num_batched_tokens x (4 hidden + 3 intermediate) at the engine dtype) and the sampler's fp32
    logits for max_num_seqs sequences (2 x [max_num_seqs, V])."""
    width = max(model.intermediate, model.moe_intermediate * max(1, model.experts_per_token))
    acts = run.max_num_batched_tokens * (4 * model.hidden + 3 * width) * run.engine_bytes
    sampler = 2 * 4 * run.max_num_seqs * model.vocab
    weights = longctx.engine_weight_bytes(model, run.engine_bytes, run.engine_fp8)
    return weights // run.engine_tp + (acts + sampler) // run.engine_tp


def kv_cache_budget(device_bytes: int, utilisation: float, others_bytes: int, engine_peak: int) -> int:
    """KV-cache bytes an engine can really allocate on a device (case C13).

    vLLM gives the KV cache utilisation * device - its own peak (weights + activations); next to
    colocated roles already holding `others_bytes`, only device - others - peak physically exist:
    budget = min(utilisation * device, device - others) - peak (never below 0). Sizing from the total
    device (ignoring the others) is the fault C13 guards against.
    """
    return max(0, min(int(utilisation * device_bytes), device_bytes - others_bytes) - engine_peak)


def kv_blocks(budget_bytes: int, model: ModelShape, run: RunShape) -> int:
    """Whole paged-KV blocks (block_size tokens each, per engine shard) that fit in `budget_bytes`."""
    block = run.block_size * model.kv_bytes_per_token(longctx.kv_dtype_bytes(run)) // run.engine_tp
    return budget_bytes // max(1, block)


def engine_bytes(model: ModelShape, run: RunShape, device_bytes: int, others_bytes: int) -> dict[str, int]:
    """One engine shard. GPU: the engine claims utilisation * device (its peak + the KV cache the budget
    allows, see kv_cache_budget). CPU: weights + the fixed KV space (rollout.kv_cache_space_gib)."""
    peak = engine_peak_bytes(model, run)
    weights = longctx.engine_weight_bytes(model, run.engine_bytes, run.engine_fp8) // run.engine_tp
    if run.device == "cpu":
        kv = int(run.kv_cache_gib * GIB)
    else:
        # vLLM counts its non-torch memory (CUDA context) inside its utilisation budget
        kv = kv_cache_budget(device_bytes, run.gpu_memory_utilization, others_bytes, peak + RUNTIME_BYTES["gpu"])
    return {"weights": weights, "grads": 0, "optimizer": 0, "activations": peak - weights, "logits": 0,
            "kv_cache": kv, "other": 0, "runtime": RUNTIME_BYTES[run.device]}


def min_kv_bytes(model: ModelShape, run: RunShape) -> int:
    """KV bytes one max_model_len sequence needs (per shard): vLLM refuses to start with less."""
    per_token = model.kv_bytes_per_token(longctx.kv_dtype_bytes(run)) / run.engine_tp
    return int(math.ceil(run.max_model_len / run.block_size) * run.block_size * per_token)
