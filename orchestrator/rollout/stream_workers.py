"""The rollout workers of fully asynchronous rollouts (`rollout.mode=stream`, orchestrator/rollout/stream_source.py):
where each group runs, every call to a worker, and a lost worker's replacement.

    engines = StreamWorkers(workers, wait, recover, restart, env_cfg, n)
    engines.assign(requests)                       # each group to the worker with the fewest samples outstanding
    for i, (samples, metrics) in engines.each("stream_drain", args=lambda i: (0.2,)): ...
    engines.drained(i, len(samples))               # those samples are no longer outstanding on worker i
    engines.prioritize(group_ids)                  # the groups the trainer waits for run first (single-turn)
    engines.fit()                                  # engines joined or left (placement.elastic); called by the above

Calls go through orchestrator/runtime/faults.py `call_engine` (the fault window is the method's name). Submits,
priorities and resumes are not waited for (a weight load queued on a worker must not hold the step): their results
are read after that worker's next drain returns, which ran after them. A worker whose call fails is asked about:
the job's `recover` hook (orchestrator/job.py `Job.recover_rollout`) says whether it is lost and starts its
replacement (synced to the current weights), or the weight sync already replaced it; then every incomplete group it
held starts again, whole, from its request, on the replacement (`restart(group id)` clears the group's finished
samples in the stream's buffer and returns its request, or None for a group no longer in flight). Counted in
`restarts` and `reissued` (the stream's `rollout/worker_restarts`, `rollout/groups_reissued`). Past run.max_restarts
the hook raises and the run stops. Pure: no Ray import (handles and `wait` are passed in).
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional

from orchestrator.rollout.source import Recover
from orchestrator.rollout.types import PromptRequest
from orchestrator.runtime.faults import call_engine

Restart = Callable[[int], Optional[PromptRequest]]  # a group id -> its request, its samples cleared; None: not in flight


class StreamWorkers:
    """The stream's workers (see the module docstring). workers: the job's handles (its list: a replacement's handle
    is set in it); wait: the job's bounded ray.get; recover: the job's hook for a lost worker (None: its error is
    raised); restart: see `Restart`; env_cfg: multi-turn tasks' `env` section (None single-turn); n: rollout.n."""

    def __init__(self, workers: list, wait: Callable, recover: Optional[Recover], restart: Restart,
                 env_cfg: Optional[dict], n: int):
        self.handles, self.wait, self.recover, self.restart = workers, wait, recover, restart
        self.env_cfg, self.n = env_cfg, n
        self.reset()
        self.restarts = self.reissued = 0  # since the counts were last taken (`take_counts`)
        self.failed = False  # a call failed where it was not recovered (`each(recover=False)`): retried by the stream

    def reset(self) -> None:
        """Forget every group (the engines are being replaced)."""
        self.sent_to = list(self.handles)  # the handle each worker's groups went to (a replacement differs)
        self.where: dict[int, int] = {}  # group id -> the worker generating it, groups not complete
        self.outstanding = [0] * len(self.handles)  # samples submitted to each worker and not drained
        self.submits: dict[int, list] = {}  # worker -> its calls not waited for, read after its next drain
        self.first: dict[int, tuple] = {}  # worker -> (its handle, the groups it was told to run first)

    def __len__(self) -> int:
        return len(self.handles)

    def size(self, r: PromptRequest) -> int:
        """The samples of request `r`'s group."""
        return r.sampling.n if r.sampling is not None else self.n

    def take_counts(self) -> tuple[int, int]:
        """(workers replaced, groups issued again) since the last call; the counts start again at 0."""
        counts, self.restarts, self.reissued = (self.restarts, self.reissued), 0, 0
        return counts

    def assign(self, requests: list[PromptRequest]) -> None:
        """Hand each group to the worker with the fewest samples outstanding (a replaced worker gets its own groups
        first, not these twice)."""
        self.reissue_replaced()
        plan: dict[int, list] = {}
        for r in requests:
            w = self.place(r.group_id, self.size(r))
            plan.setdefault(w, []).append(r)
        for w, rs in plan.items():
            self.submit_to(w, rs)

    def place(self, group_id: int, samples: int) -> int:
        """Group `group_id`'s `samples` go to the least-loaded worker; returns it (nothing is sent)."""
        w = min(range(len(self.handles)), key=lambda i: self.outstanding[i])
        self.where[group_id], self.outstanding[w] = w, self.outstanding[w] + samples
        return w

    def submit_to(self, w: int, requests: list[PromptRequest]) -> None:
        """Worker w's stream_submit (multi-turn: with the env section and its index, the sticky router's key)."""
        self.send(w, "stream_submit", *((requests, self.env_cfg, w) if self.env_cfg else (requests,)))

    def send(self, w: int, method: str, *args) -> None:
        """Worker w's `method` (submit, prioritize, resume), not waited for: read after its next drain (`each`)."""
        self.submits.setdefault(w, []).append(call_engine(self.handles, w, "stream_submit", method, *args))

    def prioritize(self, group_ids: list[int]) -> None:
        """Tell each worker which of its groups the trainer waits for, when that changed (`stream_prioritize`: they
        enter its engine first; not waited for). Multi-turn: not told (a turn is a request of its own)."""
        self.fit()
        for w, h in enumerate([] if self.env_cfg else self.handles):
            want = frozenset(g for g in group_ids if self.where.get(g) == w)
            if self.first.get(w, (h, frozenset())) != (h, want):  # (a replacement is told, if only "none")
                self.send(w, "stream_prioritize", sorted(want))
            self.first[w] = (h, want)

    def drained(self, w: int, samples: int) -> None:
        """`samples` finished samples came back from worker w."""
        self.outstanding[w] -= samples

    def keep(self, in_flight) -> None:
        """Forget where the groups not in `in_flight` ran (complete, dropped)."""
        for gid in [g for g in self.where if g not in in_flight]:
            self.where.pop(gid)

    def each(self, method: str, recover: bool = True,
             args: Callable[[int], tuple] = lambda i: ()) -> Iterator[tuple[int, object]]:
        """Every worker's `method(*args(i))` at once (a replaced worker gets its groups first; the fault window is the
        method's name); yields (i, result) of each worker that answered, i its index when it answered; a lost one is
        replaced (`lost`) and skipped (not `recover`: any failed one is skipped, and `failed` set). A worker that
        left the job meanwhile (placement.elastic: another's loss moved the engines) is skipped: its groups start
        again elsewhere (`fit`)."""
        self.reissue_replaced()
        handles = list(self.handles)
        refs = [call_engine(handles, i, method, method, *args(i)) for i in range(len(handles))]
        for i, ref in enumerate(refs):
            try:
                out = self.wait(ref)
            except Exception as e:  # noqa: BLE001 - `lost` raises what is not a lost worker
                if recover:
                    self.lost(handles[i], e)
                self.failed = self.failed or not recover
                continue
            j = self.index(handles[i])
            if j is None or self.sent_to[j] is not handles[i]:
                continue  # left the job, or its groups were restarted since the call (`fit`)
            for submitted in self.submits.pop(j, []):  # ran before this call: returned already
                self.wait(submitted)
            yield j, out

    def index(self, handle) -> Optional[int]:
        """The index `handle` has in the job's engine list now (None: it left)."""
        return next((j for j, h in enumerate(self.handles) if h is handle), None)

    def lost(self, handle, error: BaseException) -> None:
        """A call through `handle` failed: unless the job's hook says the worker is lost (and replaces it, or, under
        placement.elastic, lets it leave: the last engine takes its index), the error is raised; its groups then start
        again (`fit`: on the replacement or the others). A handle no longer in the job (replaced or left since the
        call was made) is not asked about."""
        if self.recover is None:
            raise error
        w = self.index(handle)
        if w is not None:
            self.submits.pop(w, None)  # its calls died with it; its groups are issued again
            new = self.recover(w, error)
            if new is None:
                raise error
            if w < len(self.handles) and self.handles[w] is handle:  # a list the job does not share
                self.handles[w] = new
            self.restarts += 1
        self.reissue_replaced()

    def reissue_replaced(self) -> None:
        self.fit()
        for w in range(len(self.handles)):
            self.reissue_if_replaced(w)

    def fit(self) -> None:
        """Follow the job's engine list when engines joined, left or moved (placement.elastic: an engine is added
        last; one that leaves is killed and the last engine takes its index). An engine still in the job keeps its
        groups, outstanding samples and pending calls at its index now; a new one starts empty; the groups of one
        that left start again, whole, on the least-loaded engines (counted in `reissued`, as a lost worker's).
        Nothing to do while every engine still in the job is at its index (a replacement in place:
        `reissue_if_replaced` gives it the replaced one's groups)."""
        n = len(self.handles)
        moved = {i: j for i, j in ((i, self.index(h)) for i, h in enumerate(self.sent_to)) if j is not None}
        if n == len(self.sent_to) and all(i == j for i, j in moved.items()):
            return
        now = {j: i for i, j in moved.items()}  # index now -> old index, engines still here
        orphans = [g for g, i in self.where.items() if i not in moved]
        self.where = {g: moved[i] for g, i in self.where.items() if i in moved}
        self.outstanding = [self.outstanding[now[j]] if j in now else 0 for j in range(n)]
        self.submits = {moved[i]: calls for i, calls in self.submits.items() if i in moved}
        self.first = {moved[i]: v for i, v in self.first.items() if i in moved}
        self.sent_to = list(self.handles)
        again = [r for r in map(self.restart, orphans) if r is not None]
        self.reissued += len(again)
        plan: dict[int, list] = {}
        for r in again:
            plan.setdefault(self.place(r.group_id, self.size(r)), []).append(r)
        for w, rs in plan.items():
            self.submit_to(w, rs)

    def reissue_if_replaced(self, w: int) -> None:
        """Worker w was replaced since its groups were sent (here or by the weight sync): each incomplete group it
        held starts again from nothing on the replacement."""
        if self.handles[w] is self.sent_to[w]:
            return
        self.sent_to[w] = self.handles[w]
        held = [g for g, at in self.where.items() if at == w]
        again = [r for r in map(self.restart, held) if r is not None]
        self.outstanding[w] = sum(self.size(r) for r in again)
        self.reissued += len(again)
        if again:
            self.submit_to(w, again)
