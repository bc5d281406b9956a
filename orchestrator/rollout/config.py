"""The `rollout` section of the run config: the engines, the sampling distribution and when batches generate
(`rollout.mode`, orchestrator/rollout/modes.py). Its fields state their ranges (rollout.n >= 2: GRPO's advantages
compare the samples of a group, Shao et al. 2024, DeepSeekMath, eq. 3); orchestrator/config/schema.py composes it
into `Config`; the loader resolves `rollout.mode` with
`algo.max_staleness` and the deprecated keys (orchestrator/config/rollout_mode.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.config.fields import choice, number


@dataclass
class RolloutConfig:
    num_workers: int = number(1, gt=0)  # R: rollout replicas (one vLLM engine each); placement.elastic: the start
    # placement.elastic: the engine count's range while the run goes (0 = rollout.num_workers; docs/elastic.md)
    min_workers: int = number(0, ge=0, finite=True)
    max_workers: int = number(0, ge=0, finite=True)
    # engines started and kept warm beside the job's, each in a group of its own: one takes a lost engine's place at
    # once (orchestrator/placement/spares.py; disaggregated placement, env.placement=thread)
    spare_workers: int = number(0, ge=0, finite=True)
    # samples per prompt: the group size (GRPO compares the samples of a group: 2 at least)
    n: int = number(8, ge=2, note="(GRPO compares the samples of a group)")
    prompts_per_step: int = number(4, gt=0)  # groups per step; the global batch is prompts_per_step * n
    # The sampling distribution, one value for the engine, the trainer and the reference (orchestrator/algo/
    # sampler_support.py): training replays the truncations, so on-policy ratios stay 1 (docs/algorithms.md)
    temperature: float = number(1.0, gt=0)
    top_p: float = number(1.0, gt=0, le=1)
    top_k: int = number(0, ge=0, note="(0 = off)")  # the k most probable tokens
    min_p: float = number(0.0, ge=0, lt=1)  # tokens at least min_p x the most probable one's probability; 0 = off
    max_new_tokens: int = number(64, gt=0)
    # vLLM engine
    # in_process: vLLM's LLM, its engine core in the rollout worker's process (the default; starts fastest, 6-7 s
    # less on CPU) | async_llm: vLLM's AsyncLLM, its engine core and model in a process of their own, so the worker's
    # Ray calls never wait on the model under one GIL (actors/rollout/async_llm_engine.py). async_llm takes the
    # weight_sync strategies whose receiver needs no Ray (disk, object_store) and tensor_parallel_size 1.
    engine: str = choice("in_process", ("in_process", "async_llm"))
    dtype: str = choice("bfloat16", ("bfloat16", "float32", "float16"))  # engine weights dtype: bfloat16 | float32 | float16
    # FP8 rollouts: CUDA engines only (orchestrator/config/fp8_rollout.py; planned by `rl-orch plan memory` too)
    quantization: str = choice("none", ("none", "fp8"))  # fp8: vLLM's FP8 weights for the linear layers
    kv_cache_dtype: str = choice("auto", ("auto", "fp8"))  # auto: the engine dtype; fp8: 1-byte keys and values
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = number(0.5, gt=0, le=1)
    kv_cache_space_gib: int = number(2, gt=0)  # CPU only: VLLM_CPU_KVCACHE_SPACE
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


def check_rollout_section(cfg) -> None:
    """rollout.engine=async_llm against what its engine core (a process of vLLM's, no Ray worker) can do: a
    weight_sync.strategy whose receiver runs outside Ray (orchestrator/weight_sync/registry.py `outside_ray`; "auto"
    chooses among those) and rollout.tensor_parallel_size 1 (vLLM's Ray executor from that process is untested
    here). Raises ValueError naming the keys."""
    from orchestrator.weight_sync.registry import get, outside_ray_names

    r = cfg.rollout
    if r.engine != "async_llm":
        return
    if r.tensor_parallel_size > 1:
        raise ValueError(f"rollout.engine=async_llm: rollout.tensor_parallel_size={r.tensor_parallel_size} is not "
                         "supported yet (1, or rollout.engine=in_process)")
    strategy = cfg.weight_sync.strategy
    if strategy != "auto" and not get(strategy).outside_ray:
        raise ValueError(f"rollout.engine=async_llm: weight_sync.strategy={strategy} is not marked to load outside Ray "
                         "(a collective group or object refs inside the engine), and AsyncLLM's engine core is no Ray "
                         f"worker; use one of {list(outside_ray_names())} (or auto), or rollout.engine=in_process (a "
                         "strategy module of your own that needs no Ray in the engine sets OUTSIDE_RAY = True: "
                         "docs/extending_weight_sync.md)")
