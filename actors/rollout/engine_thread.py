"""The thread that owns a rollout engine: it builds the engine, steps it, and runs every other call that runs the
model or touches its weights (loads, checksums, probes, sleep/wake) between two steps. Callers still abort requests
(`paused`, a hold) and read vLLM's counters on their own threads: neither runs the model. `StreamingGenerator`
(actors/rollout/stream.py) is the one subclass: it decides what each step runs.

Why one thread for everything: the engine runs its model with torch's OpenMP threads, and OpenMP keeps one team of
threads per calling thread. A second thread calling into the engine (the actor's own thread, beside a stepping
thread) gives the process two teams; libgomp then manages more threads than there are cores and shortens its
spin-wait, so every parallel region of a step waits for sleeping threads to wake. Measured in a Ray actor on this
project's 2-core machine (benchmarks/RESULTS.md, "One engine driver on the rollout worker"): an engine built on the
actor's thread and stepped on another was 5-22% slower a batch (6x the voluntary context switches) than stepped
where it was built; built and stepped on this thread, a batch takes 0.93x the time of vLLM's `LLM.generate` on the
actor's thread.

    class Driver(EngineThread):
        def _started(self): ...          # on the thread, after the build: what the steps need
        def _interrupt(self): ...        # abort the requests in flight (tokens kept): a list to continue later
        def _requeue(self, items): ...   # continue them (first)
        def _steps(self): ...            # the step loop: runs `_run_calls()` when `calls` is set; returns on close
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Optional


class EngineThread:
    """State every driver shares (see the module docstring): `cond` (guards `calls`, `waiting`, `error`, `closed`
    and the subclass's queues), `engine_lock` (the engine: one step, one batch of calls or one pause at a time)."""

    def __init__(self, engine: Any = None):
        import torch

        self.engine = engine
        self.calls: list = []  # (fn, result box, done event) of `call`, run by the thread before its next step
        self.cond = threading.Condition()
        self.engine_lock = threading.Lock()
        self.waiting = 0  # callers of `paused` waiting for the engine: the thread starts no step meanwhile
        self.error: Optional[BaseException] = None
        self.closed = False
        self.released = False  # the thread has ended: `call`s run on their callers
        self.threads = torch.get_num_threads()  # the engine's OpenMP pool (vllm_engine._size_cpu_threads sized it)
        self.thread: Optional[threading.Thread] = None

    def _start(self, build: Optional[Callable[[], Any]], name: str) -> None:
        """Start the thread (it builds the engine with `build` when given) and wait until it is ready; raises the
        build's error."""
        started, failed = threading.Event(), []
        self.thread = threading.Thread(target=self._run, args=(build, started, failed), name=name, daemon=True)
        self.thread.start()
        started.wait()
        if failed:
            raise failed[0]

    def _run(self, build: Optional[Callable[[], Any]], started: threading.Event, failed: list) -> None:
        import torch

        try:
            if build is not None:
                self.engine = build()
                self.threads = torch.get_num_threads()  # the pool the engine was built with, on this thread
            self._started()
        except BaseException as e:  # noqa: BLE001 - raised by `_start`
            failed.append(e)
            return
        finally:
            started.set()
        try:
            # OpenMP's thread count is per thread: a new thread starts from OMP_NUM_THREADS (1 in a fractional-CPU
            # Ray actor), and vLLM's CPU attention refuses a pool other than the one its metadata was built for.
            # vLLM replaces torch.set_num_threads by a no-op once its CPU worker started; torch._C's is the real one.
            torch._C.set_num_threads(self.threads)
            self._steps()
        except BaseException as e:  # noqa: BLE001 - an engine error: recorded for the callers (`_died`)
            self._died(e)
        finally:
            self._release_calls()

    def _died(self, error: BaseException) -> None:
        """The thread ends on `error` (an engine error): recorded, so that later `call`s run on their callers and
        the subclass raises it to its callers."""
        with self.cond:
            self.error = self.error or error
            self.cond.notify_all()

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(engine)` run on this thread with the engine idle: the requests in flight are aborted (tokens kept) and
        continue after it (as in `paused`). Returns its result or raises its error. Once the thread has ended (an
        engine error, `close`), `fn` runs on the caller."""
        if threading.current_thread() is self.thread:
            return fn(self.engine)
        box: dict = {}
        done = threading.Event()
        with self.cond:
            direct = self.released
            if not direct:
                self.calls.append((fn, box, done))
                self.cond.notify_all()
        if not direct:
            done.wait()
            direct = box.get("direct", False)
        if direct:
            return fn(self.engine)
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _run_calls(self) -> None:
        """The pending `call`s (this thread, under `engine_lock`), the requests in flight aborted and continued after."""
        with self.cond:
            calls, self.calls = self.calls, []
        if not calls:
            return
        try:
            interrupted = self._interrupt()
        except BaseException as e:  # noqa: BLE001 - the engine failed: every caller gets the error, then `_died`
            for _, box, done in calls:
                box["error"] = e
                done.set()
            raise
        try:
            for fn, box, done in calls:
                try:
                    box["result"] = fn(self.engine)
                except BaseException as e:  # noqa: BLE001 - raised by `call` in its caller
                    box["error"] = e
                done.set()
        finally:
            self._requeue(interrupted)

    def _release_calls(self) -> None:
        """The thread ends: the pending `call`s run on their callers."""
        with self.cond:
            self.released = True
            calls, self.calls = self.calls, []
        for _, box, done in calls:
            box["direct"] = True
            done.set()

    @contextmanager
    def paused(self):
        """Hold the engine idle on the caller's thread (for work that does not run the model: it is not `call`):
        the requests in flight are aborted (tokens kept) and continue when the block exits (also when it raises).
        Waits for the step in progress to end."""
        with self._engine():
            interrupted = self._interrupt()
            try:
                yield
            finally:
                self._requeue(interrupted)

    @contextmanager
    def _engine(self):
        """The engine for a caller: the thread starts no new step while a caller waits, so it gets the engine
        at the next step boundary (Python's locks are not fair)."""
        with self.cond:
            self.waiting += 1
        try:
            with self.engine_lock:
                with self.cond:
                    self.waiting -= 1
                yield
        finally:
            with self.cond:
                self.cond.notify_all()

    # ---- the subclass's part ----------------------------------------------------------------------------
    def _started(self) -> None:
        """On the thread, after the build."""

    def _interrupt(self) -> list:
        raise NotImplementedError

    def _requeue(self, items: list) -> None:
        raise NotImplementedError

    def _steps(self) -> None:
        raise NotImplementedError
