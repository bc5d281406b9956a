"""Pre-flight memory check: a run's config -> the planner's inputs -> refuse to start when it won't fit.

    plan = preflight(cfg, model_path, prompt_len=max_prompt_tokens)   # MemoryPlanError when it won't fit

`GRPOController.run()` calls `preflight` before it starts any actor (when `memory.preflight` is true);
`memory.force` (`rl-orch run --force`) starts anyway with a warning. `rl-orch plan memory --config`
prints the same plan. The device size is `memory.device_gib`, else the local GPU's memory on a GPU run
(`placement.resource: GPU`), else on a CPU run the host's RAM (the smaller of physical memory and
the cgroup limit); a GPU run planned on a machine without a GPU is not judged.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Optional

from orchestrator.memory.estimate import DTYPE_BYTES, GIB, RunShape
from orchestrator.memory.longctx import long_context_fields
from orchestrator.memory.params import load_hf_config
from orchestrator.memory.planner import MemoryPlan, format_plan, plan_memory
from orchestrator.memory.shapes import ModelShape, model_shape
from orchestrator.placement.plan import on_gpu

# Same set as actors.model.forward.FAST_PATH_ARCHS (pure modules may not import actors; a unit test compares):
# these project only the response positions to logits.
FAST_PATH_ARCHS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                             "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM"})


class MemoryPlanError(RuntimeError):
    """The run would not fit in memory; the message holds the plan's table and the suggested changes."""

    def __init__(self, plan: MemoryPlan):
        self.plan = plan
        super().__init__("the run does not fit in memory (memory.force=true or `rl-orch run --force` starts it "
                         "anyway):\n" + format_plan(plan))


def host_memory_bytes() -> int:
    """Physical RAM of this host, or the cgroup (v2 / v1) memory limit when that is smaller."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def device_memory_bytes(cfg) -> Optional[int]:
    """memory.device_gib, else the local GPU's total memory (GPU runs), else host RAM (CPU runs);
    None for a GPU run planned where no GPU is visible."""
    if cfg.memory.device_gib > 0:
        return int(cfg.memory.device_gib * GIB)
    if not on_gpu(cfg):
        return host_memory_bytes()
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


def _colocated(cfg) -> tuple:
    """Roles whose per-worker GPU fractions fit beside the trainer's on one GPU, in bundle order (Ray
    packs fractional GPU requests onto one GPU while they sum to at most 1)."""
    p, share, out = cfg.placement, cfg.placement.trainer_per_worker, []
    critic = (("critic", cfg.critic.per_worker),) if cfg.algo.estimator == "gae" else ()
    for role, fraction in (("rollout", p.rollout_per_worker), ("reference", p.reference_per_worker), *critic):
        if share + fraction <= 1.0 + 1e-9:
            out.append(role)
            share += fraction
    return tuple(out)


def longest_sequence(cfg, longest_prompt: Optional[int] = None) -> tuple[int, int]:
    """(prompt, response) tokens of the longest sequence a training step can get, which the memory plan and the
    trainer's warm-up (trainer.warm_up) size for. Single-turn: `longest_prompt`, the data's longest rendered
    prompt (None: data.max_prompt_tokens), and rollout.max_new_tokens of response. Multi-turn (env.name set): a
    trajectory of env.max_tokens ids in all, whose first prompt is the environment's first observation (not known
    before the run): every id but one counted as scored (turns and observations), the most logits it can have."""
    if cfg.env.name:
        return 1, max(cfg.env.max_tokens - 1, 1)
    return max(cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt, 1), cfg.rollout.max_new_tokens


def run_shape_from_config(cfg, hf_config: dict[str, Any], prompt_len: Optional[int] = None) -> RunShape:
    """The RunShape a run config describes. prompt_len: the longest rendered prompt (tokens); default
    data.max_prompt_tokens. Sequences are `longest_sequence`'s. Frozen copies count 4 bytes a parameter: the
    reference, the reward model and a LoRA base are loaded in fp32 by the actors."""
    t, r = cfg.trainer, cfg.rollout
    prompt, response = longest_sequence(cfg, prompt_len)
    arch = (hf_config.get("architectures") or [""])[0]
    attention = hf_config.get("_attn_implementation") or hf_config.get("attn_implementation") or "sdpa"
    reward = None
    if cfg.reward.model_path:
        reward = model_shape(load_hf_config(cfg.reward.model_path), name=str(cfg.reward.model_path))
    return RunShape(
        algorithm="ppo" if cfg.algo.estimator == "gae" else "grpo", device="gpu" if on_gpu(cfg) else "cpu", precision=t.precision,
        trainer_ranks=t.num_workers, micro_batch_size=t.micro_batch_size, seq_len=prompt + response,
        response_len=response, packing_tokens=t.micro_batch_tokens if t.packing else 0,
        gradient_checkpointing=t.gradient_checkpointing, attention="eager" if attention == "eager" else "sdpa",
        logits_all_positions=arch not in FAST_PATH_ARCHS, lora_rank=t.lora.rank,
        lora_targets=tuple(t.lora.target_modules), frozen_bytes=4, reference=cfg.algo.kl_coef > 0,
        reward_model=reward, engines=r.num_workers, engine_tp=int(getattr(r, "tensor_parallel_size", 1)),
        engine_bytes=DTYPE_BYTES[r.dtype], gpu_memory_utilization=r.gpu_memory_utilization,
        kv_cache_gib=r.kv_cache_space_gib, max_model_len=r.max_model_len, colocated=_colocated(cfg),
        block_size=int(getattr(r, "block_size", 0) or (16 if on_gpu(cfg) else 128)),  # 0: vLLM's default
        critic_ranks=cfg.critic.num_workers if cfg.algo.estimator == "gae" else 0, critic_micro_batch_size=cfg.critic.micro_batch_size)


def plan_for_config(cfg, model_path: str | Path, prompt_len: Optional[int] = None) -> MemoryPlan:
    """The memory plan of a run config for the model folder (or config.json) at `model_path`.

    Raises ModelConfigError naming the file when the model's config.json is missing or malformed.
    """
    hf = load_hf_config(model_path)
    shape: ModelShape = model_shape(hf, name=Path(model_path).name)
    run = dataclasses.replace(run_shape_from_config(cfg, hf, prompt_len), **long_context_fields(cfg))
    return plan_memory(shape, run, device_memory_bytes(cfg))


def preflight(cfg, model_path: str | Path, prompt_len: Optional[int] = None) -> MemoryPlan:
    """Plan the run; raise MemoryPlanError (message: the table and suggestions) when a device would not
    fit, unless memory.force is set (then a warning with the table goes to stderr). Returns the plan."""
    plan = plan_for_config(cfg, model_path, prompt_len)
    if not plan.fits:
        if not cfg.memory.force:
            raise MemoryPlanError(plan)
        print("warning: the memory plan says this run does not fit; starting anyway (memory.force):\n"
              + format_plan(plan), file=sys.stderr)
    return plan
