"""The in-process CPU engine decodes on all its bound cores inside a Ray actor.

Ray sets OMP_NUM_THREADS=1 in an actor that holds a fraction of a CPU (the rollout bundle's 0.5 CPU here),
and the in-process vLLM CPU engine keeps the OpenMP pool it finds: before the fix the rollout actor
decoded on one thread, 0.65-0.71x of bare vLLM on the same 2 cores (benchmarks/rollout_overhead.py;
0.997x after). `engine_kwargs` now sizes the pool to VLLM_CPU_OMP_THREADS_BIND's cores first.
"""
from __future__ import annotations

import os

import pytest
import ray

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=0.5)
class _Probe:
    def threads_before_and_after(self, bind: str | None) -> tuple:
        import torch
        from omegaconf import OmegaConf

        from actors.rollout.vllm_engine import engine_kwargs
        from orchestrator.rollout.config import RolloutConfig

        if bind is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
        before = (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads())
        engine_kwargs("unused-model-path", OmegaConf.structured(RolloutConfig))
        return before, (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads())


@pytest.mark.parametrize("bind", [None, "0"])
def test_engine_kwargs_size_the_thread_pool_of_a_fractional_cpu_actor(ray_local, bind):
    import torch

    if torch.cuda.is_available():
        pytest.skip("engine_kwargs sizes CPU threads only on CPU engines; this host has CUDA")
    probe = _Probe.remote()
    try:
        before, after = ray.get(probe.threads_before_and_after.remote(bind))
    finally:
        ray.kill(probe)
    want = 1 if bind == "0" else len(os.sched_getaffinity(0))
    if "OMP_NUM_THREADS" not in os.environ:  # Ray sets it only where the driver's environment has none
        assert before == ("1", 1)  # what Ray gives the actor: the bug's precondition
    assert after == (str(want), want)
