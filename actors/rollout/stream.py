"""Streaming generation in a rollout worker (`rollout.mode=stream`): the engine generates without
pause on a thread of its own; groups are submitted and finished samples drained at any time; a weight update
interrupts the requests in flight and continues them on the new weights (actors/rollout/interruptible.py).

    stream = StreamingGenerator(vllm_engine, n=8, max_tokens=256, version=lambda: worker.version)
    stream.submit(requests)                  # PromptRequests: n PartialSamples each, queued for the engine
    samples, metrics = stream.drain(0.5)     # finished PartialSamples (waits up to 0.5 s for one)
    stream.call(lambda engine: ...)          # on the engine's thread, between two steps: load weights, probe
    with stream.paused():                    # the engine idle on the caller's thread (work that runs no model)
        ...                                  # after either, the interrupted samples continue on version()
    stream.hold(); ...; stream.release()     # the same across calls: an overlapped weight sync holds the engine
                                             # from before its load until the controller verified it
    stream.prioritize({12, 13})              # the trainer waits for these groups: theirs first (see below)
    samples = stream.generate(requests)      # synchronous generation: submit, wait until all finished (below)

Streamed multi-turn episodes (actors/rollout/stream_episodes.py) use the same engine thread: each policy turn is
one PartialSample queued with `submit_turn(sample, on_done)`; when it finishes, `on_done(sample)` is called on
the engine thread (instead of the sample going to `drain`), and a weight update interrupts and continues it like
any other. A finished episode enters `drain`'s output through `put_done`; an episode-side failure through `fail`.
None of them waits for an engine step.

This thread is the rollout worker's one engine driver: single-turn groups streamed (`submit` / `drain`), a batch
generated synchronously (`generate`: rollout.mode sync and one-step-off, held-out eval: its samples are queued
together, so the engine's first step sees the whole batch as `LLM.generate` would, and come back to the caller, never
to `drain`; they enter the engine even while it is held or prioritized, and a checkpoint's snapshot leaves them out),
and multi-turn turns (`submit_turn`, batched or streamed episodes: actors/rollout/stream_episodes.py `StreamTurns`).

Two locks: `cond` guards the queue and the finished samples (held for microseconds: `submit` and `drain` never
wait for an engine step, which lasts seconds when it prefills a batch of prompts on CPU), and `engine_lock`,
held by the engine thread for each add + step and each batch of `call`s, and by `paused` for the whole pause
(the thread, its calls and `paused`: actors/rollout/engine_thread.py; the thread builds the engine too). A caller of `paused` counts
itself as waiting first, and the thread does not start another step while one is (Python's locks are not fair:
without this a pause waited behind back-to-back steps). Measured before this split: the trainer waited a
whole prefill step (3.5-7 s) for a batch that was already finished (benchmarks/async_rl.py). The thread runs
the engine with the OpenMP pool size of the thread that made the engine.
`snapshot` (a checkpoint, orchestrator/rollout/stream_source.py) takes the engine like a pause, between two
steps, and hands over the finished samples (as `drain`) with copies of the unfinished ones; `resume` queues a
checkpoint's samples again (continuations keep their tokens). The thread takes the queue and hands its finished
samples on under `engine_lock`, so at a step boundary every sample is in exactly one of queue, engine, done.
Engine errors stop the thread and are raised by the next `drain`.
`prioritize(group_ids)` (the controller's `take` while it waits: the groups its batch still needs): while a sample
of those groups is queued or in the engine, no sample of another group enters the engine (those in it continue).
Measured without it (benchmarks/RESULTS.md): after a weight sync that interrupted a batch's last samples, the
engine took them back together with the next batch's 32 fresh prompts, one prefill step of 5.3 s, then decoded
40 sequences at 0.2 s a step, while the trainer waited for those 8 samples (8.9 s); alone they re-prefill in ~1 s
and decode at 0.07 s a step. Metrics:
`stream/busy_s` (seconds inside engine steps since the last drain), `stream/held_s` (seconds held by `hold` since
the last drain: an overlapped weight sync's load, checks and probe), the engine thread's seconds outside engine
steps since the last drain (`stream/empty_s`: nothing to run; `stream/blocked_s`: work queued but held or a caller
waiting for the engine; `stream/add_s`: handing requests to the engine), `stream/running`, `stream/queued`,
`stream/interruptions` (cumulative requests aborted by weight updates).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from actors.rollout.engine_thread import EngineThread
from orchestrator.rollout.partial import PartialSample, samples_of, snapshot_copy


IDLE_KINDS = ("empty", "blocked", "add")  # `stream/<kind>_s`: see the module docstring


class StreamingGenerator(EngineThread):
    """See the module docstring. version: returns the weight version the engine holds now."""

    def __init__(self, engine, n: int, max_tokens: int, version: Callable[[], int],
                 build: Optional[Callable[[], Any]] = None):
        """engine: a `VLLMEngine` built elsewhere, or None with `build`: a function that builds it, called on this
        driver's thread, which then owns the engine (actors/rollout/engine_thread.py; the constructor waits for it
        and raises its error). n: samples per group (rollout.n); max_tokens: a sample's budget
        (rollout.max_new_tokens); version: returns the weight version the engine holds now."""
        super().__init__(engine)  # `cond` also guards queue, done, held, the seconds counters
        self.gen = None  # InterruptibleEngine, made on the thread
        self.n, self.max_tokens, self.version = n, max_tokens, version
        self.queue: list[PartialSample] = []
        self.done: list = []  # finished PartialSamples (and EpisodeSamples, `put_done`)
        self.on_done: dict[int, Callable] = {}  # id(turn sample) -> its callback (`submit_turn`)
        self.on_error: dict[int, Callable] = {}  # id(turn sample) -> its error callback (`submit_turn`)
        self.urgent: set[int] = set()  # id(sample) of `generate`'s samples: they pass a hold and a priority
        self.first: frozenset = frozenset()  # `prioritize`: the groups whose samples enter the engine first
        self.held = False  # `hold` until `release`: the thread starts no step
        self.held_s, self.held_since = 0.0, 0.0  # seconds held since the last drain; when the hold began
        self.idle_s = dict.fromkeys(IDLE_KINDS, 0.0)  # the thread's seconds outside engine steps since the last drain
        self.idle_since: Optional[tuple[float, str]] = None  # (when, kind) of the wait the thread is in
        self.busy_s = 0.0
        self._start(build, "rollout-stream")

    def _started(self) -> None:
        self.gen = self.engine.interruptible()  # the in-process engine's InterruptibleEngine, or AsyncLLM's

    def _interrupt(self) -> list[PartialSample]:
        return self.gen.interrupt()

    def _requeue(self, items: list[PartialSample]) -> None:
        with self.cond:
            self.queue = items + self.queue

    @property
    def steps(self) -> int:
        """Engine steps run so far (int, cumulative)."""
        return self.gen.steps

    def submit(self, requests: list) -> int:
        """Queue every request's group (n samples, or its sampling override's). Returns the samples queued.
        Does not wait for the engine (the thread adds them before its next step)."""
        samples = [s for r in requests for s in samples_of(r, self.n, self.max_tokens)]
        with self.cond:
            self._raise_error()
            self.queue += samples
            self.cond.notify_all()
        return len(samples)

    def submit_turn(self, sample: PartialSample, on_done: Callable[[PartialSample], None],
                    on_error: Optional[Callable[[BaseException], None]] = None) -> None:
        """Queue one turn's sample (the engine thread adds it before its next step); `on_done(sample)` runs on the
        engine thread when it finishes (it must not block: hand the sample to another thread, e.g.
        `loop.call_soon_threadsafe`). `on_error(error)` runs instead if the engine fails or the stream is closed
        before the turn finished (on the failing thread; same rule). Raises the engine thread's error."""
        with self.cond:
            self._raise_error()
            self.on_done[id(sample)] = on_done
            if on_error is not None:
                self.on_error[id(sample)] = on_error
            self.queue.append(sample)
            self.cond.notify_all()

    def generate(self, requests: list) -> list[PartialSample]:
        """Synchronous generation: every request's group (n samples, or its sampling override's) queued at once and
        generated to the end; returns the finished samples in request order, then sample index, each with its text
        (special tokens skipped). They join whatever the engine runs (a streaming run's samples), pass a `hold` (as
        the held-out eval did beside an overlapped sync) and never reach `drain`. Raises the engine's error
        (RuntimeError, its cause attached) if it fails meanwhile, or if the stream is closed."""
        samples = [s for r in requests for s in samples_of(r, self.n, self.max_tokens)]
        if not samples:
            return []
        left, finished, errors = [len(samples)], threading.Event(), []

        def on_done(sample: PartialSample) -> None:  # engine thread
            try:
                sample.text = self.gen.text(sample)
            except BaseException as e:  # noqa: BLE001 - the caller raises it; the engine goes on
                errors.append(e)
                finished.set()
                return
            left[0] -= 1
            if left[0] == 0:
                finished.set()

        def on_error(error: BaseException) -> None:
            errors.append(error)
            finished.set()

        with self.cond:
            self._raise_error()
            for sample in samples:
                self.on_done[id(sample)], self.on_error[id(sample)] = on_done, on_error
                self.urgent.add(id(sample))
            self.queue += samples
            self.cond.notify_all()
        finished.wait()
        if errors:
            raise RuntimeError(f"the rollout stream failed during a generate call: {errors[0]!r}") from errors[0]
        return samples

    def prioritize(self, group_ids) -> None:
        """While any sample of `group_ids` (request group ids) is queued or in the engine, only those samples enter
        the engine; the others wait in the queue (samples in the engine continue). Empty: no priority."""
        with self.cond:
            self.first = frozenset(group_ids)
            self.cond.notify_all()

    def put_done(self, finished: list) -> None:
        """Finished samples produced outside the engine thread (streamed episodes), for a `drain`."""
        with self.cond:
            self.done += finished
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Record a failure of the work around the engine (a streamed episode's): the next `drain` raises it."""
        with self.cond:
            self.error = self.error or error
            self.cond.notify_all()

    def drain(self, wait_s: float = 0.0) -> tuple[list[PartialSample], dict]:
        """The samples finished since the last drain (waiting up to `wait_s` seconds for at least one) and
        the `stream/*` metrics. Does not wait for an engine step. Raises the engine thread's error, if it failed."""
        with self.cond:
            deadline = time.monotonic() + wait_s
            while not self.done and self.error is None and not self.closed and time.monotonic() < deadline:
                self.cond.wait(max(0.0, deadline - time.monotonic()))
            self._raise_error()
            out, self.done = self.done, []
            now = time.perf_counter()
            held_s = self.held_s + (now - self.held_since if self.held else 0.0)
            if self.idle_since is not None:  # the thread's wait so far counts now, the rest at the next drain
                self.idle_s[self.idle_since[1]] += now - self.idle_since[0]
                self.idle_since = (now, self.idle_since[1])
            metrics = {"stream/busy_s": self.busy_s, "stream/held_s": held_s, "stream/running": float(self.gen.running),
                       "stream/queued": float(len(self.queue)), "stream/interruptions": float(self.gen.interruptions),
                       **{f"stream/{kind}_s": s for kind, s in self.idle_s.items()}}
            self.busy_s, self.held_s, self.held_since = 0.0, 0.0, now
            self.idle_s = dict.fromkeys(IDLE_KINDS, 0.0)
        return out, metrics

    def resume(self, samples: list[PartialSample]) -> int:
        """Queue given PartialSamples (a checkpoint's: fresh ones, or continuations whose tokens so far are kept
        and which continue on `version()` as after a weight update). Returns how many. Raises the thread's error."""
        with self.cond:
            self._raise_error()
            self.queue += list(samples)
            self.cond.notify_all()
        return len(samples)

    def snapshot(self) -> tuple[list[PartialSample], list[PartialSample]]:
        """(finished, in flight) for a checkpoint: the finished samples not drained yet, handed over as `drain`
        does (so none is counted twice), and copies of every unfinished sample, in the engine or queued, with
        its tokens, versions and logprobs so far. Taken at a step boundary (waits for the step in progress,
        holds the engine for microseconds); generation goes on. Raises the thread's error."""
        with self._engine():
            with self.cond:
                self._raise_error()
                finished, self.done = self.done, []
                in_flight = [snapshot_copy(s) for s in [*self.gen.samples(), *self.queue]
                             if id(s) not in self.on_done]  # `generate`'s and turns' samples are their callers'
        return finished, in_flight

    def hold(self) -> int:
        """Like entering `paused`, across calls: the requests in flight are aborted (tokens kept) and queued first;
        the engine starts no step until `release` (submits, drains and pauses go on). Returns the requests
        interrupted. Idempotent."""
        with self._engine():
            interrupted = self.gen.interrupt()
            with self.cond:
                self.queue = interrupted + self.queue
                if not self.held:
                    self.held, self.held_since = True, time.perf_counter()
        return len(interrupted)

    def release(self) -> None:
        """End a `hold`: the queued requests continue on `version()` (a no-op when not held)."""
        with self.cond:
            if self.held:
                self.held_s += time.perf_counter() - self.held_since
            self.held = False
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the engine thread (requests in flight are aborted) and the engine (`close()`, where it has one)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        try:
            if self.engine_lock.acquire(timeout=30):  # not forever: the thread may be stuck in an engine call
                try:
                    self.gen.interrupt()
                finally:
                    self.engine_lock.release()
            self.thread.join(timeout=30)
        finally:
            self._fail_turns(RuntimeError("the rollout stream was closed before the turn finished"))
            close = getattr(self.engine, "close", None)  # an AsyncLLM engine's core process stops
            if close is not None:
                close()

    def _fail_turns(self, error: BaseException) -> None:
        """Call every unfinished turn's `on_error` (an engine failure, or `close`)."""
        with self.cond:
            callbacks = list({id(c): c for c in self.on_error.values()}.values())  # a generate call's: once
            self.on_error, self.on_done, self.urgent = {}, {}, set()
        for callback in callbacks:
            try:
                callback(error)
            except RuntimeError:  # its event loop is closed: nobody waits for that turn any more
                pass

    def _raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the rollout stream failed (engine thread or streamed episodes): "
                               f"{self.error!r}") from self.error
        if self.closed:
            raise RuntimeError("the rollout stream is closed")

    def _died(self, error: BaseException) -> None:
        """The thread ends on `error`: the next drain and every waiting turn and `generate` call get it."""
        super()._died(error)
        self._fail_turns(error)

    def _steps(self) -> None:
        while True:
            with self.cond:
                while not self.closed and not self.calls and not self._runnable():
                    work = (self.waiting or self.held) and (self.queue or self.gen.running)  # held with nothing: empty
                    self.idle_since = (time.perf_counter(), "blocked" if work else "empty")
                    self.cond.wait()
                    self.idle_s[self.idle_since[1]] += time.perf_counter() - self.idle_since[0]
                    self.idle_since = None
                if self.closed:
                    return
            t0 = time.perf_counter()
            with self.engine_lock:  # the queue is taken and the finished handed on under it: `snapshot` sees
                locked = time.perf_counter()  # a caller's pause (a load, a probe) held the engine until now
                if self.calls:
                    self._run_calls()
                    continue
                with self.cond:     # every sample in exactly one of queue, engine, done
                    new = self._admit()
                if new:  # added under the version of this moment (after a pause: the new one)
                    self.gen.add(new, self.version())  # an engine error ends the thread (`_died`)
                added = time.perf_counter()
                finished = self.gen.step() if self.gen.running else []  # a pause may have emptied it
                dt = time.perf_counter() - added
                with self.cond:
                    self.busy_s += dt
                    self.idle_s["blocked"] += locked - t0
                    self.idle_s["add"] += added - locked
                    self._finished(finished)

    def _admit(self) -> list[PartialSample]:
        """The queued samples the engine takes now (engine thread, under `engine_lock` and `cond`), out of the
        queue: all of them, or only the prioritized groups' while one of theirs is queued or in the engine."""
        first = self.first  # (runs every engine step: with nothing queued there is nothing to decide)
        if self.held:  # only `generate`'s samples run while held
            def takes(s: PartialSample) -> bool:
                return id(s) in self.urgent
        elif first and self.queue and any(s.request.group_id in first for s in [*self.queue, *self.gen.samples()]):
            def takes(s: PartialSample) -> bool:
                return s.request.group_id in first or id(s) in self.urgent
        else:
            new, self.queue = self.queue, []
            return new
        new = [s for s in self.queue if takes(s)]
        self.queue = [s for s in self.queue if not takes(s)]
        return new

    def _runnable(self) -> bool:
        """Whether the thread may start a step now (under `cond`): no caller waits for the engine, and there is work
        it may run (held: only `generate`'s samples; the hold interrupted everything else)."""
        if self.waiting:
            return False
        if self.held:
            return bool(self.gen.running) or any(id(s) in self.urgent for s in self.queue)
        return bool(self.queue or self.gen.running)

    def _finished(self, finished: list[PartialSample]) -> None:
        """Hand finished samples on (engine thread, under `cond`): a turn's to its callback, the others to `drain`."""
        for s in finished:
            self.on_error.pop(id(s), None)
            self.urgent.discard(id(s))
            callback = self.on_done.pop(id(s), None)
            if callback is not None:
                try:
                    callback(s)
                except RuntimeError:  # its event loop is closed (a failed batch of episodes): nobody waits for it
                    pass
            else:
                s.text = self.gen.text(s)  # a single-turn sample's (a turn's text is its episode's business)
                self.done.append(s)
        if finished:
            self.cond.notify_all()
