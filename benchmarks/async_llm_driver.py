"""What an engine driver on vLLM's AsyncLLM (issue 38: one driver for every rollout mode) costs and gives on this
machine, measured in one run against the in-process engine the rollout worker drives today.

    .venv/bin/python benchmarks/async_llm_driver.py [--model PATH] [--requests 4] [--max-tokens 64]

1. Engine start: `vllm.LLM` with the worker's engine arguments (actors/rollout/vllm_engine.py `engine_kwargs`, the
   engine core in this process) against `AsyncLLM` with the same arguments, whose engine core runs in a process of its
   own (vLLM refuses an in-process core under asyncio). On CPU vLLM 0.32 starts that process with `spawn` always
   (vllm/platforms/cpu.py sets VLLM_WORKER_MULTIPROC_METHOD=spawn; a Ray actor forces it too) and replaces the
   "uni" executor by its multiprocess one (it cannot set OMP's environment in process), so the default `AsyncLLM`
   is three processes, each importing vLLM: this one, the engine core, its model worker. Passing the executor class
   (`distributed_executor_backend=UniProcExecutor`, which the replacement does not match) runs the model in the core:
   two processes. Prints the three starts and their ratios to the in-process one.
2. `pause_generation(mode="keep")` mid-generation: `--requests` requests stream `--max-tokens` tokens each
   (ignore_eos); once each has 8 tokens the engine is paused: the seconds the pause took, whether the requests stay
   frozen for 1 s, the seconds a `collective_rpc` to the worker takes while paused (what a weight load would use),
   and whether every request then resumes to its whole length with its logprobs.

Not a test (benchmarks never fail on speed): it prints what it measured. Results: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = Path.home() / ".cache/rl-orchestrator/models/SmolLM2-135M-Instruct"


def _kwargs(model: str) -> dict:
    from actors.rollout.vllm_engine import engine_kwargs
    from orchestrator.config import load_config

    kw = engine_kwargs(model, load_config(str(ROOT / "configs/grpo_arith_cpu.yaml")).rollout, seed=0)
    kw.pop("weight_transfer_config", None)  # registered by the extension below, which is not used here
    kw.pop("worker_extension_cls", None)  # our weight-sync extension needs a Ray actor; not measured here
    return kw


def start_in_process(model: str) -> float:
    """Seconds to build `vllm.LLM` (engine core in this process), as the rollout worker does."""
    from vllm import LLM

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    t0 = time.perf_counter()
    llm = LLM(**_kwargs(model))
    seconds = time.perf_counter() - t0
    del llm
    return seconds


async def async_start(model: str, in_core: bool) -> float:
    """Seconds to start (and then shut down) an AsyncLLM; `in_core`: the model runs in the engine core's process."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    kw = _kwargs(model)
    if in_core:
        kw["distributed_executor_backend"] = UniProcExecutor
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    seconds = time.perf_counter() - t0
    llm.shutdown()
    return seconds


async def async_engine(model: str, requests: int, max_tokens: int) -> dict:
    """AsyncLLM's start (three processes) and its pause/resume (see the module docstring)."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    kw = _kwargs(model)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # engine_kwargs sets 0 for the in-process engine
    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    out = {"async_start_s": time.perf_counter() - t0}
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, logprobs=0, ignore_eos=True,
                            output_kind=RequestOutputKind.CUMULATIVE)
    progress: dict[int, int] = {}

    async def one(i: int):
        async for o in llm.generate(TokensPrompt(prompt_token_ids=[1, 2, 3, 4 + i]), params, request_id=f"r{i}"):
            progress[i] = len(o.outputs[0].token_ids)
        return o

    tasks = [asyncio.create_task(one(i)) for i in range(requests)]
    while min((progress.get(i, 0) for i in range(requests)), default=0) < 8:
        await asyncio.sleep(0.005)
    t1 = time.perf_counter()
    await llm.pause_generation(mode="keep", clear_cache=False)
    out["pause_s"] = time.perf_counter() - t1
    at_pause = dict(progress)
    await asyncio.sleep(1.0)
    out["frozen_while_paused"] = progress == at_pause and await llm.is_paused()
    t2 = time.perf_counter()
    await llm.collective_rpc("get_model_inspection")
    out["rpc_while_paused_s"] = time.perf_counter() - t2
    await llm.resume_generation()
    done = await asyncio.gather(*tasks)
    out["resumed_whole"] = all(len(o.outputs[0].token_ids) == max_tokens and len(o.outputs[0].logprobs) == max_tokens
                               for o in done)
    out["tokens_at_pause"] = sorted(at_pause.values())
    llm.shutdown()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    in_process = start_in_process(args.model)
    measured = asyncio.run(async_engine(args.model, args.requests, args.max_tokens))
    in_core = asyncio.run(async_start(args.model, in_core=True))
    print(f"engine start: in-process LLM {in_process:.1f} s; AsyncLLM, vLLM's default on CPU (engine core and model "
          f"worker each a spawned process) {measured['async_start_s']:.1f} s: ratio "
          f"{measured['async_start_s'] / in_process:.2f}; AsyncLLM with the model in the core "
          f"(UniProcExecutor) {in_core:.1f} s: ratio {in_core / in_process:.2f}")
    print(f"pause_generation(mode='keep') at {measured['tokens_at_pause']} tokens: {measured['pause_s']:.3f} s; "
          f"frozen for 1 s: {measured['frozen_while_paused']}; collective_rpc while paused: "
          f"{measured['rpc_while_paused_s']:.3f} s; resumed to {args.max_tokens} tokens with logprobs: "
          f"{measured['resumed_whole']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
