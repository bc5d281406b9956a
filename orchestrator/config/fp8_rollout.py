"""Load-time checks and defaults of FP8 rollouts (`rollout.quantization: fp8`, `rollout.kv_cache_dtype: fp8`).

vLLM quantises the engine's linear layers to FP8 online (per tensor, `quantization="fp8_per_tensor"`) from the
trainer's 16/32-bit weights at every weight sync (actors/weight_sync/fp8_resident.py verifies what it holds).
Its FP8 kernels are CUDA kernels: vLLM's CPU build has none (`LLM(quantization=...)` fails in
`_C::static_scaled_fp8_quant`), so both keys need GPUs, and FP8 weights need a 16-bit engine dtype.

    check_fp8_rollout(cfg)                  # ValueError naming the key: CPU placement, rollout.dtype=float32
    notes = fp8_correction_notes(cfg, explicit={"algo.tis_cap"})   # [(logging level, message)] for the start

The mismatch correction with FP8 rollouts is verl's recipe (docs/advance/fp8.md of volcengine/verl, Qwen3-8B and
Qwen3-30B-A3B DAPO runs): token-level truncated IS with C = 2 ("With TIS, FP8 rollout aligns with BF16; obvious
accuracy drop when TIS is not enabled"). That is this project's default (`algo.tis_cap: 2.0`,
`algo.rollout_correction.mode: none`), so an FP8 run keeps it. Where algo.tis_cap is null and the mode was not set,
the mode defaults to `token_mask` (IcePop, which needs no cap); an explicit `mode: none` with no cap is respected
with a warning.
"""
from __future__ import annotations

import logging

FP8_DTYPES = ("bfloat16", "float16")
# The vLLM `quantization` argument of rollout.quantization=fp8: online per-tensor FP8 from a 16-bit checkpoint
# (vLLM 0.32 refuses `quantization="fp8"` for a checkpoint that is not already FP8)
VLLM_QUANTIZATION = {"fp8": "fp8_per_tensor"}
CORRECTION_KEYS = ("algo.tis_cap", "algo.rollout_correction.mode", "algo.old_logprobs")

log = logging.getLogger(__name__)


def check_fp8_rollout(cfg) -> None:
    """Raise ValueError naming the key when FP8 rollouts cannot run: rollout.quantization=fp8 with
    rollout.dtype float32, or either FP8 key without CUDA devices (placement.resource must be GPU: CPU and
    placement.fake_gpus runs have no FP8 kernels)."""
    r, p = cfg.rollout, cfg.placement
    keys = [f"rollout.{k}=fp8" for k in ("quantization", "kv_cache_dtype") if getattr(r, k) == "fp8"]
    if not keys:
        return
    if r.quantization == "fp8" and r.dtype not in FP8_DTYPES:
        raise ValueError(f"rollout.quantization=fp8 needs rollout.dtype bfloat16 or float16 (got {r.dtype!r}): vLLM "
                         "quantises 16-bit weights to FP8 and computes in that dtype")
    if p.resource != "GPU" or p.fake_gpus > 0:
        raise ValueError(f"{' and '.join(keys)} needs CUDA GPUs (placement.resource=GPU, got "
                         f"placement.resource={p.resource!r}, placement.fake_gpus={p.fake_gpus}): vLLM's FP8 kernels "
                         "are CUDA kernels, its CPU build has none. Remove the key(s) for a CPU run")


def fp8_correction_notes(cfg, explicit: set) -> list[tuple[int, str]]:
    """[(logging level, message)] about the rollout correction of an FP8 run (none without
    rollout.quantization=fp8); sets algo.rollout_correction.mode=token_mask where algo.tis_cap is null and the
    mode was not set (cfg must be writable). `explicit`: the keys of CORRECTION_KEYS the user set."""
    if cfg.rollout.quantization != "fp8":
        return []
    a = cfg.algo
    mode, cap = a.rollout_correction.mode, a.tis_cap
    if a.old_logprobs != "trainer":
        return [(logging.WARNING, "rollout.quantization=fp8 with algo.old_logprobs=rollout: every trainer/rollout "
                 "ratio is 1, so nothing corrects the FP8 engine's mismatch (verl measured an accuracy drop without "
                 "it); set algo.old_logprobs=trainer to correct it")]
    if mode != "none":
        return [(logging.INFO, f"rollout.quantization=fp8: mismatch correction algo.rollout_correction.mode={mode}")]
    if cap is not None:
        source = "as set" if "algo.tis_cap" in explicit else "the default, verl's FP8 rollout recipe"
        return [(logging.INFO, f"rollout.quantization=fp8: mismatch correction by token-level truncated IS, "
                 f"algo.tis_cap={cap} ({source})")]
    if "algo.rollout_correction.mode" not in explicit:
        a.rollout_correction.mode = "token_mask"
        band = f"[{a.rollout_correction.token_low}, {a.rollout_correction.token_high}]"
        return [(logging.INFO, "rollout.quantization=fp8 with algo.tis_cap=null: algo.rollout_correction.mode="
                 f"token_mask by default (IcePop: tokens whose trainer/rollout ratio leaves {band} leave the loss)")]
    return [(logging.WARNING, "rollout.quantization=fp8 with algo.tis_cap=null and algo.rollout_correction.mode=none: "
             "no mismatch correction, as set; verl measured an accuracy drop of FP8 rollouts without it "
             "(set algo.tis_cap=2.0 or algo.rollout_correction.mode=token_mask)")]


def set_keys(layers, keys) -> set:
    """The dotted `keys` set (null included) in any of the OmegaConf `layers` (the YAML file, the overrides)."""
    from omegaconf import OmegaConf

    absent = object()
    return {k for k in keys if any(OmegaConf.select(x, k, default=absent) is not absent for x in layers)}


def log_fp8_correction(cfg, explicit: set) -> list[tuple[int, str]]:
    """Log `fp8_correction_notes` (at run start: load_config) and return them."""
    notes = fp8_correction_notes(cfg, explicit)
    for level, msg in notes:
        log.log(level, msg)
    return notes
