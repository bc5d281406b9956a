"""Memory terms of long sequences and low precision (pure arithmetic): context parallelism, FP8 training, FP8
rollouts. `orchestrator.memory.estimate` calls these; `planner.suggestions` offers their changes.

Context parallelism (`trainer.context_parallel_size` = c; ring attention, Liu et al. 2023): every sequence
(or packed row) is split into c chunks over c ranks of the trainer's group, so a rank holds 1/c of the
micro-batch's tokens: activations, the logits buffer and the attention's per-token key span all divide by c.
Model states still divide by all D trainer ranks (FSDP2 over the flattened data x context mesh, as
torchtitan shards it). The ring adds one layer's K/V buffers (the layers run one at a time and reuse them):
2 (K and V) x 2 (the block being sent, the block being received) blocks of tokens / c positions of
kv_heads x head_dim elements (`ring_kv_bytes`).

FP8 training (`trainer.precision: fp8`, Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; the
Transformer Engine recipe NeMo measures): the decoder's linear layers run their matmuls in FP8 and keep
their inputs for backward as FP8 casts (1 byte) instead of bf16 casts (2 bytes), and the weights' compute
copies are FP8 (1 byte) instead of bf16. fp32 master weights, fp32 gradients and AdamW's fp32 moments are
unchanged (16 bytes a parameter); norms, attention, the embedding and the LM head stay in bf16. Note:
torchao's float8 training (`convert_to_float8_training`) saves the bf16 inputs by default and recasts in
backward, so there the activation term is the bf16-autocast one; this module counts the FP8-saving recipe.

FP8 rollouts (`rollout.quantization: fp8`, vLLM's Fp8LinearMethod): the linear layers' weights at 1 byte
(per-tensor scales negligible); the embedding, the LM head and the norms stay at the engine dtype.
`rollout.kv_cache_dtype: fp8` stores keys and values at 1 byte (vLLM `kv_cache_dtype="fp8"`).
"""
from __future__ import annotations

import math

from orchestrator.memory.shapes import ModelShape


def cp_size(run) -> int:
    """c: the context-parallel ranks a sequence is split over (1 = off)."""
    return max(1, int(getattr(run, "context_parallel", 1)))


def cp_split(tokens: int, run) -> int:
    """Tokens one context-parallel rank holds of `tokens`: ceil(tokens / c)."""
    c = cp_size(run)
    return -(-tokens // c)


def linear_layer_params(model: ModelShape) -> int:
    """Parameters of one decoder layer's linear projections (attention q/k/v/o, MLP or experts, the
    router): the layer's parameters minus its two RMSNorm scales (biases are counted in, a rounding)."""
    return max(0, model.layer_params - 2 * model.hidden)


def linear_params(model: ModelShape) -> int:
    """Parameters of every decoder layer's linear projections (the LM head and the embedding excluded)."""
    return model.layers * linear_layer_params(model)


def fp8_linear_input_saving(model: ModelShape) -> int:
    """Bytes per token and layer that FP8 training saves against bf16-autocast in the tensors the linear
    layers keep for backward: the q, k, v, gate and up projections' input casts 2 -> 1 byte (5h) and
    down_proj's input (the SiLU x up product, I wide, MoE: experts_per_token x moe_intermediate) 2 -> 1
    byte, less o_proj's new FP8 input cast (h bytes) kept next to the attention output the attention
    itself keeps: 5h + I - h = 4h + I."""
    width = model.experts_per_token * model.moe_intermediate if model.experts else model.intermediate
    return 4 * model.hidden + width


def weight_copy_bytes(model: ModelShape, compute_bytes: int, fp8: bool, layers_held: int = 0) -> int:
    """Bytes of the compute-dtype weight copies: all of the model (layers_held = 0) or `layers_held`
    all-gathered layers (FSDP). FP8: the linear projections at 1 byte, everything else at compute_bytes."""
    if layers_held:
        total, linear = layers_held * model.layer_params, layers_held * linear_layer_params(model)
    else:
        total, linear = model.num_params, linear_params(model)
    if not fp8:
        return total * compute_bytes
    return linear + (total - linear) * compute_bytes


def ring_kv_bytes(model: ModelShape, tokens: int, run, compute_bytes: int) -> int:
    """The ring's K/V buffers on one rank (0 when c = 1): 2 (K, V) x 2 (send, receive) blocks of
    tokens / c positions x kv_heads x head_dim elements at compute_bytes, for the one layer in flight."""
    if cp_size(run) <= 1:
        return 0
    return 2 * 2 * cp_split(tokens, run) * model.kv_heads * model.head_dim * compute_bytes


def engine_weight_bytes(model: ModelShape, engine_bytes: int, fp8: bool) -> int:
    """An engine's weights (all shards): every parameter at engine_bytes, or with FP8 quantization the
    decoder's linear projections at 1 byte and the rest (embedding, LM head, norms) at engine_bytes."""
    if not fp8:
        return model.num_params * engine_bytes
    linear = linear_params(model)
    return linear + (model.num_params - linear) * engine_bytes


def kv_dtype_bytes(run) -> int:
    """Bytes of one K or V element in the engine's cache: 1 with kv_cache_dtype fp8, else the engine dtype."""
    return int(getattr(run, "kv_cache_bytes", 0) or run.engine_bytes)


def long_context_candidates(run) -> list:
    """(kind, config change, RunShape overrides) the planner tries when a run does not fit: context
    parallelism over c ranks (c > current, mild to strong; with more trainer ranks where c does not divide
    them), FP8 training,
    FP8 rollout weights, then FP8 weights and KV cache."""
    out = []
    for c in (2, 4, 8, 16, 32, 64):
        if c <= cp_size(run):
            continue
        ranks = run.trainer_ranks * c // math.gcd(run.trainer_ranks, c)  # the fewest ranks c divides
        more = f"trainer.num_workers={ranks} + " if ranks != run.trainer_ranks else ""
        out.append(("cp", f"{more}trainer.context_parallel_size={c} (ring attention)",
                    dict(context_parallel=c, trainer_ranks=ranks)))
    if run.precision == "bf16-autocast":
        out.append(("fp8-train", "trainer.precision=fp8", dict(precision="fp8")))
    if getattr(run, "algorithm", "grpo") != "dpo" and run.engines:
        if not run.engine_fp8:
            out.append(("fp8-rollout", "rollout.quantization=fp8", dict(engine_fp8=True)))
        if run.kv_cache_bytes != 1:
            out.append(("fp8-rollout", "rollout.quantization=fp8 rollout.kv_cache_dtype=fp8",
                        dict(engine_fp8=True, kv_cache_bytes=1)))
    return out


def long_context_fields(cfg) -> dict:
    """RunShape fields of a run config's long-context keys: trainer.context_parallel_size,
    rollout.quantization and rollout.kv_cache_dtype (trainer.precision passes through as it is)."""
    t, r = cfg.trainer, cfg.rollout
    return dict(context_parallel=int(getattr(t, "context_parallel_size", 1)),
                engine_fp8=getattr(r, "quantization", "none") == "fp8",
                kv_cache_bytes=1 if getattr(r, "kv_cache_dtype", "auto") == "fp8" else 0)


def describe(run) -> str:
    """The plan's note on the run line: ', context parallel c=4, FP8 rollout weights + KV cache' ('' if none)."""
    out = [f"context parallel c={cp_size(run)}"] if cp_size(run) > 1 else []
    if run.engine_fp8 or run.kv_cache_bytes == 1:
        out.append("FP8 rollout " + " + ".join(w for w, on in (("weights", run.engine_fp8),
                                                               ("KV cache", run.kv_cache_bytes == 1)) if on))
    return "".join(", " + x for x in out)
