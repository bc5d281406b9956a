"""`rollout.engine=async_llm`: the rollout worker's engine as vLLM's `AsyncLLM`, its engine core (and the model) in a
process of its own, behind the same driver as the in-process engine (actors/rollout/stream.py `StreamingGenerator`:
`generate`, `submit` / `drain`, multi-turn turns, `call`, `hold`).

    engine = AsyncLLMEngine(model_path, rollout_cfg, seed)   # VLLMEngine's calls: update_weights, prompt_scores, ...
    gen = engine.interruptible()                              # InterruptibleEngine's: add / step / interrupt

What changes against the in-process engine (actors/rollout/vllm_engine.py):
- The engine core steps in its own process, so nothing of the model runs under this process's GIL: the actor's Ray
  calls (submits, drains, a trainer's batch pulled) no longer contend with the engine's step (the in-process engine
  lost 7-25% of a streaming step to it on GPU-less runs, benchmarks/RESULTS.md). The driver's thread runs this
  engine's asyncio loop: `step` waits on it until the core delivered outputs, and every call (a load, a probe) runs
  on it between two steps, as before.
- A weight update aborts the requests in flight and continues them on the new weights from their tokens so far, as
  the in-process engine does, not with `pause_generation(mode="keep")`: a kept request continues on KV computed by
  the old weights, so its next tokens' logprobs belong to no single policy (tests/integration/test_partial_rollout.py
  checks that each continued token's logprob is the new weights' to 1e-3). Tokens the core sampled after the last
  step the driver processed are dropped with the abort; the continuation samples them again on the new weights.
  The load is vLLM's weight-transfer protocol (start, update, finish) run in the core as one call (the extension's
  `transfer_weights`): the core steps on its own between calls, and a step between those three would run
  half-reloaded layers.
- Calls into the engine's worker (weight loads, checksums, fault hooks) go through `collective_rpc` with the method
  and its arguments pickled (vLLM's IPC needs `VLLM_ALLOW_INSECURE_SERIALIZATION=1` for any argument but plain
  data and tensors at the top level; the socket is local to this node and its peer is the core this actor
  started). A payload of tensors is therefore copied into the core once (object_store); disk payloads are paths.
  The core is no Ray worker: the strategies whose receiver needs Ray (nccl/gloo collectives, delta's object refs)
  are refused at load (orchestrator/rollout/config.py), until vLLM's native weight transfer carries them (issue 39).
- The engine core can die on its own (out of memory, a crash) while the worker's process lives: the rollout worker's
  actor then ends its own process, so that the job replaces it as any lost worker (docs/faults.md); the core ends
  when the worker's process is gone.
- On CPU, vLLM would run the model in a third process (its CPU platform swaps the uni executor for its
  multiprocess one); `UniProcExecutor` passed as a class keeps it in the core. Each start imports vLLM once more
  (6-7 s here, benchmarks/async_llm_driver.py): the in-process engine stays the default on CPU.
- The front end and the core talk over zmq IPC sockets, files vLLM makes in /tmp and leaves there when the actor is
  killed: they are made in a folder of their own, removed once the core is connected (the open connections stay).
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from actors.rollout.interruptible import InterruptibleEngine
from actors.rollout.vllm_engine import VLLMEngine, engine_kwargs

_IDS = itertools.count()
WATCH_S = 1.0  # how often a call checks that the core is alive, and the core that its parent is


def _extension_call(method: str, args: tuple, worker) -> Any:
    """In the engine core: `worker.<method>(*args)` (the worker-extension methods of
    actors/weight_sync/vllm_extension.py; `collective_rpc` passes the worker last, after the partial's arguments)."""
    return getattr(worker, method)(*args)


def _start_core(async_llm, engine_args):
    """`AsyncLLM.from_engine_args` with the environment the core needs: pickled calls allowed (the module docstring;
    read at every call, so it stays), and, restored after the start (other engines in this process keep theirs),
    multiprocessing on (vllm_engine.engine_kwargs defaults it off) and the zmq IPC sockets in a folder of their own,
    removed once the core is connected."""
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    ipc = tempfile.mkdtemp(prefix="rl_orch_vllm_ipc_")
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_RPC_BASE_PATH": ipc}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return async_llm.from_engine_args(engine_args)
    finally:
        shutil.rmtree(ipc, ignore_errors=True)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _exit_with_parent(worker) -> None:
    """In the engine's worker (the core's process on CPU and with one GPU): end the process when its parent is gone
    (the rollout worker's process, SIGKILLed or crashed: vLLM's core does not watch it, and an orphaned core would
    keep its GPU memory and cores)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGKILL)  # at once: nothing of the core's is worth a clean exit now

    threading.Thread(target=watch, name="rl-orch-parent-watch", daemon=True).start()


def _force_eager(worker) -> None:
    """In the engine core: nothing compiled (rollout.enforce_eager on CPU; vllm_engine._eager_sampler_on_cpu)."""
    import torch

    torch.compiler.set_stance("force_eager")


class AsyncLLMEngine(VLLMEngine):
    """`VLLMEngine`'s calls over a vLLM `AsyncLLM` (see the module docstring). Build it, and call it, on one thread:
    the driver's (actors/rollout/engine_thread.py); the asyncio loop it makes runs only inside its calls."""

    def __init__(self, model_path: str, rollout_cfg, seed: int = 0, sleep_mode: bool = False,
                 exit_with_core: bool = False):
        """exit_with_core: end this process (SIGKILL) within a second of the engine core's death, so that Ray reports
        the rollout worker's actor as died and the job replaces it as any lost worker (docs/faults.md); otherwise
        the calls raise (`run`). Raises VLLMAPIError (actors/rollout/vllm_compat.py) naming each vLLM API it uses
        that the installed vLLM lacks, before the engine starts; vLLM's own errors if the core fails to start."""
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from actors.pinning import engine_placement_kwargs
        from actors.rollout.vllm_compat import ASYNC, check_vllm_api

        check_vllm_api(also=ASYNC)
        on_gpu = torch.cuda.is_available()
        kwargs = {**engine_kwargs(model_path, rollout_cfg, seed), **engine_placement_kwargs(rollout_cfg, sleep_mode)}
        self.sleep_mode = kwargs.get("enable_sleep_mode", False)
        if not on_gpu:
            from vllm.v1.executor.uniproc_executor import UniProcExecutor

            kwargs["distributed_executor_backend"] = UniProcExecutor  # the model in the core: two processes, not three
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)  # this thread's: the client's asyncio sockets bind to it
        self.llm = _start_core(AsyncLLM, AsyncEngineArgs(**kwargs))
        self.cfg = rollout_cfg
        self.closed = False
        self.tokenizer = self.llm.get_tokenizer()
        self.run(self.llm.collective_rpc(_exit_with_parent))
        if exit_with_core:
            threading.Thread(target=self._exit_with_core, name="rl-orch-core-watch", daemon=True).start()
        if not on_gpu and rollout_cfg.enforce_eager:
            self.run(self.llm.collective_rpc(_force_eager))
        if getattr(rollout_cfg, "ray_metrics", False):
            from actors.rollout.vllm_metrics import export_to_ray

            self.ray_metrics = export_to_ray(self.llm)

    def run(self, coro) -> Any:
        """Run `coro` on this engine's loop to its end (the loop runs only here: between two calls the core goes on
        generating and its outputs wait in the socket). Raises RuntimeError when the engine core dies meanwhile
        (vLLM fails a call in flight only through its output stream, so a call into a dead core would wait forever)."""
        return self.loop.run_until_complete(self._watched(coro))

    async def _watched(self, coro) -> Any:
        task = asyncio.ensure_future(coro)
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_S)
            if done:
                return task.result()
            if self.llm.errored:
                task.cancel()
                raise RuntimeError("vLLM's engine core process died (rollout.engine=async_llm)") from self.llm.dead_error

    def _exit_with_core(self) -> None:
        """This process ends when the engine core died (not when it was closed): a rollout worker without its engine
        is replaced by the job like a killed one (vLLM's EngineDeadError would otherwise end the run)."""
        while not self.closed:
            if self.llm.errored:
                print("rollout worker: vLLM's engine core process died (rollout.engine=async_llm); ending this "
                      "worker's process so that the job replaces it", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(WATCH_S)

    def interruptible(self) -> "AsyncRequests":
        return AsyncRequests(self)

    def close(self) -> None:
        """Stop the engine core's process and close the loop (idempotent; after the driver's thread ended)."""
        self.closed = True
        self.llm.shutdown()
        if self.loop.is_closed() or self.loop.is_running():  # running: a driver thread still stuck in a call
            return
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))  # and vLLM's closing callbacks
        self.loop.close()

    # ---- VLLMEngine's primitives over AsyncLLM ----------------------------------------------------------------
    def _rpc(self, method: str, args: tuple) -> list:
        return self.run(self.llm.collective_rpc(functools.partial(_extension_call, method, tuple(args))))

    def _reset_prefix_cache(self) -> bool:
        return bool(self.run(self.llm.reset_prefix_cache()))

    def _set_weight_version(self, version: str) -> None:
        self.run(self.llm.update_weight_version(version))

    def _one_output(self, prompt, params):
        async def last():
            out = None
            async for out in self.llm.generate(prompt, params, f"one-{next(_IDS)}"):
                pass
            return out

        return self.run(last())

    def _metrics(self) -> list:
        from vllm.v1.metrics.reader import get_metrics_snapshot

        return get_metrics_snapshot()  # this process's registry: AsyncLLM records the core's stats here

    def _sleep(self, level: int) -> None:
        self.run(self.llm.sleep(level))

    def _wake_up(self, tags) -> None:
        self.run(self.llm.wake_up(tags))


class AsyncRequests(InterruptibleEngine):
    """`InterruptibleEngine` over an `AsyncLLMEngine`: each request is an `AsyncLLM.generate` task on the engine's
    loop; `step` runs the loop until the core delivered outputs and returns the samples that finished; `interrupt`
    aborts the requests in flight (their tokens so far kept: those of the outputs already handed to `step`)."""

    def __init__(self, engine: AsyncLLMEngine):
        super().__init__(engine)
        self.on_loop, self.loop = engine.run, engine.loop  # (InterruptibleEngine.run is its step loop)
        self.tasks: dict[str, asyncio.Task] = {}
        self.pending: list = []  # RequestOutputs delivered since the last step
        self.errors: list[BaseException] = []
        self.arrived = asyncio.Event()

    def _add_request(self, request_id: str, prompt, params) -> None:
        # created on the idle loop: the request reaches the core when the next step runs it (one loop run per step,
        # not one per request)
        self.tasks[request_id] = self.loop.create_task(self._follow(request_id, prompt, params))

    async def _follow(self, request_id: str, prompt, params) -> None:
        try:
            async for out in self.llm.generate(prompt, params, request_id):
                self.pending.append(out)
                self.arrived.set()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the engine failed (EngineDeadError ...): the next step raises it
            self.errors.append(e)
            self.arrived.set()
        finally:
            self.tasks.pop(request_id, None)

    def _outputs(self) -> list:
        self.on_loop(self._wait())
        if self.errors:
            raise RuntimeError(f"the AsyncLLM engine failed: {self.errors[0]!r}") from self.errors[0]
        out, self.pending = self.pending, []
        return out

    async def _wait(self) -> None:
        if not self.pending and not self.errors:
            await self.arrived.wait()
        self.arrived.clear()
        await asyncio.sleep(0)  # the other requests' tasks hand over the outputs of the same core step

    def _abort(self, request_ids: list[str]) -> None:
        self.on_loop(self._abort_all(request_ids))

    async def _abort_all(self, request_ids: list[str]) -> None:
        await self.llm.abort(request_ids)
        tasks = [self.tasks.pop(rid) for rid in request_ids if rid in self.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        dropped = set(request_ids)
        self.pending = [o for o in self.pending if o.request_id not in dropped]
