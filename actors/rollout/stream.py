"""Streaming generation in a rollout worker (`rollout.partial_rollout=true`): the engine generates without
pause on a thread of its own; groups are submitted and finished samples drained at any time; a weight update
interrupts the requests in flight and continues them on the new weights (actors/rollout/interruptible.py).

    stream = StreamingGenerator(vllm_engine, n=8, max_tokens=256, version=lambda: worker.version)
    stream.submit(requests)                  # PromptRequests: n PartialSamples each, queued for the engine
    samples, metrics = stream.drain(0.5)     # finished PartialSamples (waits up to 0.5 s for one)
    with stream.paused():                    # the engine is idle and holds no KV inside: load weights, probe
        ...                                  # on exit the interrupted samples continue on version()

Streamed multi-turn episodes (actors/rollout/stream_episodes.py) use the same engine thread: each policy turn is
one PartialSample queued with `submit_turn(sample, on_done)`; when it finishes, `on_done(sample)` is called on
the engine thread (instead of the sample going to `drain`), and a weight update interrupts and continues it like
any other. A finished episode enters `drain`'s output through `put_done`; an episode-side failure through `fail`.
`submit_turn` and `put_done` post into an inbox the engine thread empties at each step boundary: the episodes'
thread never waits for an engine step.

The engine thread steps the in-process vLLM engine while it has work, releasing the lock between steps; every
caller (submit, drain, paused) counts itself as waiting first, and the thread lets waiting callers in at the next
step boundary (Python's locks are not fair: without this a drain waited seconds behind back-to-back steps). The
thread runs the engine with the OpenMP pool size of the thread that made the engine.
Engine errors stop the thread and are raised by the next `drain`. Metrics:
`stream/busy_s` (seconds inside engine steps since the last drain), `stream/running`, `stream/queued`,
`stream/interruptions` (cumulative requests aborted by weight updates).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional

from actors.rollout.interruptible import InterruptibleEngine
from orchestrator.rollout.partial import PartialSample, samples_of

IDLE_WAIT_S = 0.05  # an idle engine thread looks at the inbox at least this often (seconds)


class StreamingGenerator:
    """See the module docstring. version: returns the weight version the engine holds now."""

    def __init__(self, engine, n: int, max_tokens: int, version: Callable[[], int]):
        self.gen = InterruptibleEngine(engine)
        self.n, self.max_tokens, self.version = n, max_tokens, version
        self.cond = threading.Condition()
        self.queue: list[PartialSample] = []
        self.done: list = []  # finished PartialSamples (and EpisodeSamples, `put_done`)
        self.on_done: dict[int, Callable] = {}  # id(turn sample) -> its callback (engine thread only)
        self.inbox: list[tuple] = []  # (turn sample, callback) and (finished, None), moved in by the engine thread
        self.inbox_lock = threading.Lock()  # never held across an engine step: episode threads never wait on one
        self.waiting = 0  # callers waiting for the lock (`_turn`): the engine thread lets them in first
        self.waiting_lock = threading.Lock()
        self.busy_s = 0.0
        self.error: Optional[BaseException] = None
        self.closed = False
        import torch

        self.threads = torch.get_num_threads()  # the engine's OpenMP pool (vllm_engine._size_cpu_threads sized it)
        self.thread = threading.Thread(target=self._loop, name="rollout-stream", daemon=True)
        self.thread.start()

    def submit(self, requests: list) -> int:
        """Queue every request's group (n samples, or its sampling override's). Returns the samples queued."""
        samples = [s for r in requests for s in samples_of(r, self.n, self.max_tokens)]
        with self._turn():
            self._raise_error()
            self.queue += samples
        return len(samples)

    def submit_turn(self, sample: PartialSample, on_done: Callable[[PartialSample], None]) -> None:
        """Queue one turn's sample without waiting for the engine's step to end (the engine thread takes it at its
        next step boundary); `on_done(sample)` runs on the engine thread when it finishes (it must not block: hand
        the sample to another thread, e.g. `loop.call_soon_threadsafe`). Raises the engine thread's error."""
        self._raise_error()
        self._post((sample, on_done))

    def put_done(self, finished: list) -> None:
        """Finished samples produced outside the engine thread (streamed episodes) for a `drain` (not waiting for
        the engine's step to end either)."""
        self._post(*((s, None) for s in finished))

    def _post(self, *items: tuple) -> None:
        """Into the inbox; wake the engine thread if it is idle (a busy one takes the inbox at its next step; an
        idle one also looks every IDLE_WAIT_S, so a wake-up lost to a race is late, never lost)."""
        with self.inbox_lock:
            self.inbox += items
        if self.cond.acquire(blocking=False):
            try:
                self.cond.notify_all()
            finally:
                self.cond.release()

    def fail(self, error: BaseException) -> None:
        """Record a failure of the work around the engine (a streamed episode's): the next `drain` raises it."""
        with self._turn():
            self.error = self.error or error

    def drain(self, wait_s: float = 0.0) -> tuple[list[PartialSample], dict]:
        """The samples finished since the last drain (waiting up to `wait_s` seconds for at least one) and
        the `stream/*` metrics. Raises the engine thread's error, if it failed."""
        with self._turn():
            deadline = time.monotonic() + wait_s
            while not self.done and self.error is None and time.monotonic() < deadline:
                self.cond.wait(max(0.0, deadline - time.monotonic()))
            self._raise_error()
            out, self.done = self.done, []
            metrics = {"stream/busy_s": self.busy_s, "stream/running": float(self.gen.running),
                       "stream/queued": float(len(self.queue) + len(self.inbox)),
                       "stream/interruptions": float(self.gen.interruptions)}
            self.busy_s = 0.0
        return out, metrics

    @contextmanager
    def paused(self):
        """Hold the engine idle: the requests in flight are aborted (tokens kept) and continue on `version()`
        when the block exits (also when it raises)."""
        with self._turn():
            interrupted = self.gen.interrupt()
            try:
                yield
            finally:
                self.queue = interrupted + self.queue

    @contextmanager
    def _turn(self):
        """The engine's lock for a caller: the engine thread yields it at its next step boundary (it waits while
        a caller is waiting), so a caller never starves behind back-to-back steps (Python's locks are not fair)."""
        with self.waiting_lock:
            self.waiting += 1
        with self.cond:
            with self.waiting_lock:
                self.waiting -= 1
            try:
                yield
            finally:
                self.cond.notify_all()

    def close(self) -> None:
        """Stop the engine thread (requests in flight are aborted)."""
        with self._turn():
            self.closed = True
            self.gen.interrupt()
        self.thread.join(timeout=30)

    def _raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the rollout stream failed (engine thread or streamed episodes): "
                               f"{self.error!r}") from self.error

    def _loop(self) -> None:
        import torch

        # OpenMP's thread count is per thread: a new thread starts from OMP_NUM_THREADS (1 in a fractional-CPU Ray
        # actor), and vLLM's CPU attention refuses a pool other than the one its metadata was built for. vLLM
        # replaces torch.set_num_threads by a no-op once its CPU worker started; torch._C's is the real one.
        torch._C.set_num_threads(self.threads)
        while True:
            with self.cond:
                while not self.closed and (self.waiting or not (self.queue or self.gen.running or self.inbox)):
                    self.cond.wait(IDLE_WAIT_S)
                if self.closed:
                    return
                self._take_inbox()
                try:
                    if self.queue:
                        self.gen.add(self.queue, self.version())
                        self.queue = []
                    t0 = time.perf_counter()
                    finished = self.gen.step() if self.gen.running else []
                    self.busy_s += time.perf_counter() - t0
                except BaseException as e:  # noqa: BLE001 - handed to the caller by drain()
                    self.error = e
                    self.cond.notify_all()
                    return
                self._finished(finished)

    def _take_inbox(self) -> None:
        """(Engine thread, under the lock) turns into the queue, finished episodes into `done`."""
        with self.inbox_lock:
            items, self.inbox = self.inbox, []
        for sample, callback in items:
            if callback is None:
                self.done.append(sample)
                continue
            self.on_done[id(sample)] = callback
            self.queue.append(sample)
        if any(callback is None for _, callback in items):
            self.cond.notify_all()

    def _finished(self, finished: list[PartialSample]) -> None:
        """Hand finished samples on (under the lock): a turn's to its callback, the others to `drain`."""
        for s in finished:
            callback = self.on_done.pop(id(s), None)
            if callback is not None:
                callback(s)
                continue
            s.text = self.gen.text(s)
            self.done.append(s)
        if finished:
            self.cond.notify_all()
