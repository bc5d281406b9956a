"""Sticky routing of rollout groups to rollout workers: consistent hashing with bounded loads.

Every turn of a trajectory and every sample of a group go to the same rollout worker, so the
engine's prefix (KV) cache holds the shared prompt and each trajectory's growing history. A group is
placed by consistent hashing on its group id; a worker already holding its share is skipped, so no
worker takes more than

    capacity = ceil((1 + eps) * m / n)      (m groups placed, counting the new one; n workers)

(Mirrokni, Thorup, Zadimoghaddam 2018, "Consistent Hashing with Bounded Loads", SODA; section 2).
A placed group stays on its worker until `release` (sticky). Hashing is blake2b of the key text, so
placement is the same in every process and run.

Try it: ``python -c "from orchestrator.rollout.router import StickyRouter; r = StickyRouter(4); print([r.assign(g) for g in range(8)])"``
"""
from __future__ import annotations

import bisect
import hashlib
import math


def stable_hash(text: str) -> int:
    """64-bit blake2b hash of `text` (deterministic across processes, unlike `hash`)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class StickyRouter:
    """Consistent hashing with bounded loads over rollout workers 0..num_workers-1 (or given names).

    Args:
        workers: number of workers, or a list of worker ids (hashable, distinct).
        eps: load slack (> 0): capacity = ceil((1 + eps) * groups / workers).
        virtual_nodes: ring points per worker (more = smoother split before the bound applies).
    Raises:
        ValueError: no workers, duplicate ids, eps <= 0 or virtual_nodes < 1.

    Loads count placed groups (one unit per group, whatever its size). `release` lowers the count
    but never moves another group, so after releases a worker may hold more than the capacity
    computed for the smaller total; every `assign` respects the capacity at its own time.
    """

    def __init__(self, workers: int | list, eps: float = 0.25, virtual_nodes: int = 64):
        ids = list(range(workers)) if isinstance(workers, int) else list(workers)
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"rollout workers must be a non-empty list of distinct ids, got {workers!r}")
        if not eps > 0 or virtual_nodes < 1:
            raise ValueError(f"router: need eps > 0 and virtual_nodes >= 1, got eps={eps}, virtual_nodes={virtual_nodes}")
        self.eps, self.virtual_nodes = eps, virtual_nodes
        self._ring: list[tuple[int, object]] = []
        self._load: dict = {}
        self._owner: dict = {}
        for w in ids:
            self.add_worker(w)

    @property
    def workers(self) -> list:
        return list(self._load)

    def loads(self) -> dict:
        """Placed groups per worker."""
        return dict(self._load)

    def capacity(self, groups: int) -> int:
        """ceil((1 + eps) * groups / workers): the most groups one worker may take."""
        return math.ceil((1 + self.eps) * groups / len(self._load))

    def worker_of(self, group_id) -> object | None:
        """The worker holding `group_id`, or None when it is not placed."""
        return self._owner.get(group_id)

    def assign(self, group_id) -> object:
        """The worker of `group_id`: its current one when placed (sticky), else place it.

        A new group walks the ring clockwise from hash("group:<id>") and takes the first worker whose
        load is below `capacity(placed + 1)`; one always exists because capacity * workers >= placed + 1.
        """
        if group_id in self._owner:
            return self._owner[group_id]
        cap = self.capacity(len(self._owner) + 1)
        start = bisect.bisect(self._ring, stable_hash(f"group:{group_id}"), key=lambda p: p[0])
        for i in range(len(self._ring)):
            worker = self._ring[(start + i) % len(self._ring)][1]
            if self._load[worker] < cap:
                self._owner[group_id] = worker
                self._load[worker] += 1
                return worker
        raise AssertionError("unreachable: bounded-load capacity leaves a free worker")

    def release(self, group_id) -> None:
        """Forget `group_id` (all its trajectories finished). Unknown ids are ignored."""
        worker = self._owner.pop(group_id, None)
        if worker is not None:
            self._load[worker] -= 1

    def add_worker(self, worker) -> None:
        """Add a worker's ring points. Placed groups stay where they are (their caches stay warm)."""
        if worker in self._load:
            raise ValueError(f"rollout worker {worker!r} is already routed to")
        self._load[worker] = 0
        for v in range(self.virtual_nodes):
            bisect.insort(self._ring, (stable_hash(f"worker:{worker}#{v}"), worker), key=lambda p: p[0])

    def remove_worker(self, worker) -> list:
        """Remove a worker; its placed groups are re-placed on the others. Returns those group ids."""
        if worker not in self._load:
            raise ValueError(f"rollout worker {worker!r} is not routed to (workers: {self.workers})")
        if len(self._load) == 1:
            raise ValueError("cannot remove the last rollout worker")
        moved = [g for g, w in self._owner.items() if w == worker]
        for g in moved:
            self.release(g)
        del self._load[worker]
        self._ring = [p for p in self._ring if p[1] != worker]
        for g in moved:
            self.assign(g)
        return moved
