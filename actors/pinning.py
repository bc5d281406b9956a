"""Pin an actor's process to the CPU cores of its fake GPUs (CPU runs with `placement.fake_gpus`).

With `placement.resource=fake_gpu` and `placement.fake_gpus=N`, each fake GPU stands for one CPU core
(orchestrator/placement/plan.py maps bundles to core ids). The job passes an actor its cores in the
environment variable `RL_ORCH_CPU_CORES` ("0,1"); the actor calls `pin_from_env` first thing in its
constructor, before torch makes its thread pool (threads inherit the mask): `os.sched_setaffinity` and
`torch.set_num_threads(len(cores))`. (Ray's per-actor `worker_process_setup_hook` did not run in Ray 2.60,
measured, so the pin is explicit.) vLLM engines also get
`VLLM_CPU_OMP_THREADS_BIND` set to the same cores (see `engine_env`). Without the variable nothing happens.

Run: nothing to run; tests/integration/test_placement_modes.py checks an actor's `os.sched_getaffinity`.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

CORES_ENV = "RL_ORCH_CPU_CORES"


def parse_cores(text: str) -> list[int]:
    """"0,2,3" -> [0, 2, 3]. Raises ValueError naming RL_ORCH_CPU_CORES for anything else."""
    try:
        cores = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"{CORES_ENV}={text!r} must be a comma-separated list of core ids") from None
    if not cores or min(cores) < 0:
        raise ValueError(f"{CORES_ENV}={text!r} must name at least one core id >= 0")
    return cores


def pin_to_cores(cores: Sequence[int]) -> None:
    """Restrict this process (all its threads made later) to `cores` and size torch's intra-op pool to them.

    Raises ValueError when a core is not allowed for this process (e.g. outside its cgroup cpuset)."""
    allowed = os.sched_getaffinity(0)
    bad = sorted(set(cores) - allowed)
    if bad:
        raise ValueError(f"{CORES_ENV}: cores {bad} are not available to this process (allowed: {sorted(allowed)})")
    os.sched_setaffinity(0, set(cores))
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    import torch

    torch.set_num_threads(len(cores))


def pin_from_env() -> Optional[list[int]]:
    """Pin to $RL_ORCH_CPU_CORES when set (call first in an actor's constructor); returns the cores or None."""
    text = os.environ.get(CORES_ENV)
    if not text:
        return None
    cores = parse_cores(text)
    pin_to_cores(cores)
    return cores


def pin_from_env_count() -> int:
    """Pin to $RL_ORCH_CPU_CORES when set (see `pin_from_env`), then the torch thread count to use: the
    pinned cores, or the host's cores when not pinned (Ray sets OMP_NUM_THREADS to a fractional actor's
    CPU count, 1, which would starve a CPU trainer)."""
    cores = pin_from_env()
    return len(cores) if cores else (os.cpu_count() or 1)


def engine_env(cores: Sequence[Sequence[int]]) -> dict[str, str]:
    """Environment of a pinned vLLM CPU engine: the process pinned to every core of its fake GPUs and
    vLLM's OpenMP threads bound to them, one "|"-separated list per tensor-parallel rank (vLLM's CPU
    backend format: VLLM_CPU_OMP_THREADS_BIND="0,1|2,3")."""
    flat = sorted({c for rank in cores for c in rank})
    return {CORES_ENV: ",".join(map(str, flat)),
            "VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, sorted(set(r)))) for r in cores)}


def engine_placement_kwargs(rollout_cfg, sleep_mode: bool, on_gpu: Optional[bool] = None) -> dict:
    """Extra `vllm.LLM` kwargs from the placement: `enable_sleep_mode=True` for a colocated engine on a GPU
    (vLLM refuses sleep mode on CPU: "Sleep mode is not supported on current platform"), and, with
    rollout.tensor_parallel_size t > 1, `tensor_parallel_size=t, distributed_executor_backend="ray"`: vLLM's
    Ray executor then uses the placement group this actor was started in (captured child tasks; bundles
    from VLLM_RAY_BUNDLE_INDICES, device share from VLLM_RAY_PER_WORKER_GPUS; see placement_plan.py)."""
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    kwargs: dict = {}
    if sleep_mode and on_gpu:
        kwargs["enable_sleep_mode"] = True
    t = int(getattr(rollout_cfg, "tensor_parallel_size", 1) or 1)
    if t > 1:
        kwargs.update(tensor_parallel_size=t, distributed_executor_backend="ray")
    return kwargs
