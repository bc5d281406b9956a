"""The only module that imports vLLM: one in-process engine that samples groups and takes new weights.

Sampled-token logprobs are returned with the sampling temperature applied
(`logprobs_mode="processed_logprobs"`: log_softmax(logits / T), case C03), so the trainer's
recomputed logprobs are directly comparable. New weights arrive through the worker extension
`actors.weight_sync.vllm_extension.WeightReceiverExtension`.
"""
from __future__ import annotations

import gc
import os
from typing import Any, Sequence


EXTENSION = "actors.weight_sync.vllm_extension.WeightReceiverExtension"
TRANSFER_BACKEND = "rl_orch"  # our weight-transfer engine's vLLM backend name (transfer_engine.BACKEND)


def _set_cpu_env(kv_cache_space_gib: int) -> None:
    """vLLM on CPU: in-process engine, all cores bound, a fixed KV-cache budget (setdefault: users win)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))


def _host_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or Slurm's cpuset, fake-GPU pinning)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _engine_cpu_count(bind: str) -> int:
    """How many cores the in-process engine's OpenMP threads get from VLLM_CPU_OMP_THREADS_BIND: its first
    "|"-separated list ("0-3", "0,2,5-6"); this process's cores for "auto"/"nobind"/empty.
    Raises ValueError naming the variable for a malformed list."""
    first = bind.split("|")[0].strip()
    if first in ("", "auto", "nobind"):
        return _host_cores()
    cores: set[int] = set()
    try:
        for part in first.split(","):
            lo, _, hi = part.strip().partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            if hi_i < lo_i:
                raise ValueError
            cores.update(range(lo_i, hi_i + 1))
    except ValueError:
        raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND={bind!r}: expected core lists like '0-3' or '0,2,5-6' "
                         "('|' between tensor-parallel ranks)") from None
    return len(cores)


def _size_cpu_threads() -> None:
    """Size torch's OpenMP pool to the engine's cores before vLLM starts. Ray sets OMP_NUM_THREADS=1 in an
    actor holding a fraction of a CPU, and the in-process CPU engine keeps the pool it finds: decoding on
    one thread ran at 0.65-0.71x of bare vLLM on the same 2 cores (benchmarks/rollout_overhead.py).
    Several unpinned CPU engines on one host each take every core; pin them (fake GPUs) to split the cores.
    Tensor-parallel CPU ranks run in vLLM's own processes and are not sized here."""
    import torch

    n = _engine_cpu_count(os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""))
    os.environ["OMP_NUM_THREADS"] = str(n)
    if torch.get_num_threads() != n:  # vLLM stubs torch.set_num_threads out once an engine has started here
        torch.set_num_threads(n)


def _eager_sampler_on_cpu(enforce_eager: bool) -> None:
    """With rollout.enforce_eager on the CPU backend, nothing in this engine's process is compiled: vLLM still
    wraps one sampler helper in torch.compile (`batched_count_greater_than`, the rank of each sampled token, an
    integer count) and compiled it with inductor at the first generate, 4 s of each engine's start on this 2-core
    machine (a tiny-model run: 16.8 s -> 12.8 s, docs/testing.md). Eager, the count is the same and no sampled token
    or logprob changes (the CPU sampler is a fused C++ op, never compiled). On GPUs vLLM's compiled count saves
    memory, so it stays; with enforce_eager=false the model is compiled and so is the helper."""
    if enforce_eager:
        import torch

        torch.compiler.set_stance("force_eager")  # every torch.compile in this process runs its function eagerly


def _freeze_import_heap() -> None:
    """`gc.freeze()` before the engine is built: the objects this process made so far (the imports of torch,
    transformers and vLLM: millions of them) move to the garbage collector's permanent generation, which its
    collections skip. vLLM's start calls `gc.collect()` five times (the model loader, its own freeze after start)
    and each walked that heap: 1.1-1.3 s of an engine's 6.7 s start on this 2-core machine (the tiny model,
    `LLM(**engine_kwargs(...))` alone, 2 runs each way). vLLM freezes its heap itself once started
    (vllm/utils/gc_utils.py `freeze_gc_heap`, after a full collection); this only does it before the collections
    instead. What is frozen is never collected, so whatever garbage the imports left stays: import-time cycles, a
    few MB at most; `EngineCore.shutdown` unfreezes."""
    gc.freeze()


class VLLMEngine:
    """A vLLM `LLM` with token-id prompts in and samples out (the driver: actors/rollout/stream.py)."""

    def __init__(self, model_path: str, rollout_cfg, seed: int = 0, sleep_mode: bool = False):
        """Raises VLLMAPIError (actors/rollout/vllm_compat.py) naming each vLLM API this engine uses that the installed
        vLLM lacks, before the engine is built."""
        from vllm import LLM

        from actors.pinning import engine_placement_kwargs
        from actors.rollout.vllm_compat import check_vllm_api

        check_vllm_api()

        # sleep_mode (colocated placement): vLLM's sleep mode on GPUs; on CPU vLLM has none, sleep is a no-op.
        # rollout.tensor_parallel_size > 1: vLLM's Ray executor in this actor's placement group.
        placement = engine_placement_kwargs(rollout_cfg, sleep_mode)
        self.sleep_mode = placement.get("enable_sleep_mode", False)
        kwargs = engine_kwargs(model_path, rollout_cfg, seed)
        _freeze_import_heap()
        self.llm = LLM(**kwargs, **placement)
        self.cfg = rollout_cfg
        self.tokenizer = self.llm.get_tokenizer()
        if getattr(rollout_cfg, "ray_metrics", False):
            from actors.rollout.vllm_metrics import export_to_ray

            self.ray_metrics = export_to_ray(self.llm)  # vLLM's vllm:* metrics also as Prometheus ray_vllm_*

    def close(self) -> None:
        """Nothing to stop: this engine's core runs in this process (`AsyncLLMEngine.close` stops its own)."""

    # ---- what differs between vLLM's two front ends (`AsyncLLMEngine`, actors/rollout/async_llm_engine.py) ----
    def interruptible(self):
        """The driver's request side over this engine: an `InterruptibleEngine` (actors/rollout/interruptible.py)."""
        from actors.rollout.interruptible import InterruptibleEngine

        return InterruptibleEngine(self)

    def _rpc(self, method: str, args: tuple) -> list:
        """Every worker's result of the worker-extension `method(*args)`."""
        return self.llm.collective_rpc(method, args=args)

    def _reset_prefix_cache(self) -> bool:
        return self.llm.reset_prefix_cache()

    def _set_weight_version(self, version: str) -> None:
        """vLLM's own weight version (what its outputs carry), set after every load."""
        self.llm.llm_engine.set_weight_version(version)

    def _one_output(self, prompt, params):
        """The final `RequestOutput` of one request."""
        return self.llm.generate([prompt], params, use_tqdm=False)[0]

    def _metrics(self) -> list:
        return self.llm.get_metrics()

    def _sleep(self, level: int) -> None:
        self.llm.sleep(level=level)

    def _wake_up(self, tags) -> None:
        self.llm.wake_up(tags=tags)

    # ---- the engine's calls (the driver runs each on its thread: actors/rollout/engine_thread.py) --------------
    def sleep(self, level: int = 1) -> None:
        """vLLM's `sleep(level)` when sleep mode is on (GPU, colocated); otherwise nothing."""
        if self.sleep_mode:
            self._sleep(level)

    def wake_up(self, tags=None) -> None:
        """vLLM's `wake_up(tags)` when sleep mode is on (GPU, colocated); otherwise nothing."""
        if self.sleep_mode:
            self._wake_up(tags)

    def cache_counters(self) -> dict[str, float]:
        """vLLM's own cumulative counters of this engine, in tokens: `prefix_cache_queries` (prompt tokens
        looked up in the prefix cache = prefill tokens requested), `prefix_cache_hits` (of those, found
        cached: not recomputed), `generation_tokens`. Take differences between two calls for a step."""
        wanted = {"vllm:prefix_cache_queries": "prefix_cache_queries", "vllm:prefix_cache_hits": "prefix_cache_hits",
                  "vllm:generation_tokens": "generation_tokens"}
        out = {v: 0.0 for v in wanted.values()}
        for m in self._metrics():
            if m.name in wanted:
                out[wanted[m.name]] += float(m.value)
        return out

    def prompt_logprobs(self, token_ids: Sequence[int], first: int) -> list[float]:
        """Logprobs [len(token_ids) - first] (float, nats) of token_ids[first:], each given the ids before it:
        vLLM's prompt logprobs, which are log_softmax(logits) at temperature 1 whatever `logprobs_mode` (the
        weight-sync probe, orchestrator/weight_sync/probe.py). One greedy token is generated, so the global
        sampling RNG is not consumed (rollouts stay as seeded); prompt logprobs skip the prefix cache."""
        return self.prompt_scores(token_ids, first).logprobs

    def prompt_scores(self, token_ids: Sequence[int], first: int, top_k: int = 0):
        """`ProbeScores` of token_ids[first:]: their logprobs as `prompt_logprobs` and, with `top_k` > 0 (at most
        vLLM's max_logprobs, 20), per position {token id: logprob} of the top_k most likely next tokens and the
        actual one (the probe's full-distribution check)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from orchestrator.weight_sync.probe import ProbeScores

        ids = [int(t) for t in token_ids]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=int(top_k), detokenize=False)
        rows = self._one_output(TokensPrompt(prompt_token_ids=ids), params).prompt_logprobs
        positions = range(max(first, 1), len(ids))
        top = [{int(t): float(lp.logprob) for t, lp in rows[p].items()} for p in positions] if top_k > 0 else None
        return ProbeScores([float(rows[p][ids[p]].logprob) for p in positions], top=top)

    def connect_weights(self, strategy, info: dict, engine_index: int) -> None:
        """vLLM's `init_weight_transfer_engine` in every worker: `strategy`'s receiver (a registry entry or a
        registered name) connects with the sender's `info` as engine `engine_index`
        (actors/weight_sync/transfer_engine.py)."""
        self._rpc("init_weight_transfer_engine", ({"strategy": strategy, "info": info, "engine_index": engine_index},))

    def update_weights(self, strategy, payload, version: int) -> dict:
        """Load `version` through vLLM's weight-transfer protocol in every worker (`start_weight_update`,
        `update_weights` with `strategy`'s `payload`, `finish_weight_update`), set vLLM's own weight version, drop the
        prefix cache (stale KV must never be reused) and return the engine's own checksums of its resident weights
        (see orchestrator.weight_sync.checksum). Raises what the receiver raised (a torn file, a timed-out group), and
        RuntimeError when the prefix cache cannot be dropped (a request still holds KV blocks)."""
        # one call per worker (the extension's `transfer_weights`), so an engine core takes no step between the
        # three, when its layers are mid-reload (AsyncLLM's core steps on its own between calls)
        self._rpc("transfer_weights", ({"strategy": strategy, "payload": payload, "version": int(version)},))
        self._set_weight_version(str(version))
        if not self._reset_prefix_cache():  # requests still hold KV blocks: their stale KV could be served
            raise RuntimeError("weight sync: the prefix cache could not be dropped after the load because requests "
                               "still hold KV blocks; interrupt or finish every request before a weight update")
        return self.weight_checksums()

    def extension_call(self, method: str, *args) -> Any:
        """Any other worker-extension method (group setup, debugging hooks); the first worker's result."""
        return self._rpc(method, args)[0]

    def weight_checksums(self) -> dict:
        """{"version": int, "groups": {group: [sum, sumsq, numel]}, ...}: the one worker's report, or under
        tensor parallelism the workers' agreed report (raises WeightMismatchError when they disagree; see
        orchestrator.weight_sync.checksum.combine_worker_reports)."""
        from orchestrator.weight_sync.checksum import combine_worker_reports
        from orchestrator.weight_sync.fp8_check import merge_fp8

        reports = self._rpc("weight_checksums", ())
        fp8 = merge_fp8(reports)  # FP8 engines: every worker's re-quantisation check (its own shards)
        return {**combine_worker_reports(reports), **({"fp8": fp8} if fp8 else {})}


def engine_kwargs(model_path: str, rollout_cfg, seed: int = 0) -> dict[str, Any]:
    """The keyword arguments of our `vllm.LLM` (also used by benchmarks/rollout_overhead.py for bare vLLM).
    Sets vLLM's environment first: the engine core in this process (so the worker extension can join the
    ray.util.collective weight-sync group, which needs a Ray actor process, and share tensors in place)
    and, without CUDA, the CPU backend's thread binding and KV-cache budget, and (enforce_eager) no compilation."""
    import torch

    on_gpu = torch.cuda.is_available()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not on_gpu:
        _set_cpu_env(rollout_cfg.kv_cache_space_gib)
        _size_cpu_threads()
        _eager_sampler_on_cpu(rollout_cfg.enforce_eager)
    kwargs: dict[str, Any] = dict(
        model=model_path, dtype=rollout_cfg.dtype, enforce_eager=rollout_cfg.enforce_eager,
        enable_prefix_caching=rollout_cfg.enable_prefix_caching, max_model_len=rollout_cfg.max_model_len,
        seed=seed, logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION,
        weight_transfer_config={"backend": TRANSFER_BACKEND},  # actors/weight_sync/transfer_engine.py
        disable_log_stats=False,  # vLLM's counters feed `cache_counters` (prefix-cache hits, prefill)
    )
    if on_gpu:
        kwargs["gpu_memory_utilization"] = rollout_cfg.gpu_memory_utilization
    else:
        kwargs.update(cpu_seeded_scheduling(rollout_cfg.max_model_len))
    if getattr(rollout_cfg, "block_size", 0):  # prefix caching reuses whole blocks of this many tokens
        kwargs["block_size"] = rollout_cfg.block_size
    kwargs.update(fp8_kwargs(rollout_cfg))
    return kwargs


def fp8_kwargs(rollout_cfg) -> dict[str, Any]:
    """vLLM's FP8 arguments: rollout.quantization=fp8 -> quantization="fp8_per_tensor" (online per-tensor FP8
    of the linear layers from the 16-bit weights; vLLM 0.32 keeps `"fp8"` for FP8 checkpoints), and
    rollout.kv_cache_dtype=fp8 -> kv_cache_dtype="fp8". {} without them (load-time checks:
    orchestrator/config/fp8_rollout.py)."""
    from orchestrator.config.fp8_rollout import VLLM_QUANTIZATION

    out: dict[str, Any] = {}
    if getattr(rollout_cfg, "quantization", "none") != "none":
        out["quantization"] = VLLM_QUANTIZATION[rollout_cfg.quantization]
    if getattr(rollout_cfg, "kv_cache_dtype", "auto") != "auto":
        out["kv_cache_dtype"] = rollout_cfg.kv_cache_dtype
    return out


def cpu_seeded_scheduling(max_model_len: int) -> dict[str, Any]:
    """vLLM scheduler settings for per-request seeds on the CPU backend: chunked prefill off, a step budget of
    max(max_model_len, 4096) tokens (vLLM's CPU default; it must hold a whole prompt then). With chunked
    prefill, vLLM 0.32 rewinds a seeded request's generator after a partial prefill (`gen.set_offset`),
    which a CPU torch.Generator refuses ("CPU Generator does not use offset"): any prompt split across
    steps crashed the engine. The throughput cost: benchmarks/seeded_sampling.py (before | whole | after)."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(max_model_len), 4096)}
