"""Rank 0 of a group of data-parallel Ray actors (the FSDP2 trainer, actors/trainer/sharded.py, and the PPO
critic, actors/critic_sharded.py) takes every call from the controller and fans it out to ranks 1..D-1, so
the controller talks to one handle whatever D is.

A class mixing `RankLeader` in sets `rank`, `dp_size` (D), `timeout_s` and `peers = []` in its constructor and
names its role in `ROLE` (error messages)."""
from __future__ import annotations

import ray


class RankLeader:
    """`set_peers` (rank 0 only) and the fan-out of a call to the peers, waited for within `timeout_s`."""

    ROLE = "trainer"
    rank: int
    dp_size: int
    timeout_s: float
    peers: list

    def set_peers(self, peers: list) -> None:
        """Rank 0 only: the actor handles of ranks 1..D-1, in rank order. Raises ValueError otherwise."""
        if self.rank != 0 or len(peers) != self.dp_size - 1:
            raise ValueError(f"set_peers: {self.ROLE} rank {self.rank} got {len(peers)} peers; "
                             f"rank 0 takes D-1 = {self.dp_size - 1}")
        self.peers = list(peers)

    def _fan_out(self, method: str, *args) -> list:
        """`method(*args)` on every peer, not waited for (the refs). Raises RuntimeError off rank 0 or before
        `set_peers`."""
        if self.rank != 0:
            raise RuntimeError(f"{self.ROLE} rank {self.rank}: only rank 0 takes calls from the controller")
        if len(self.peers) != self.dp_size - 1:
            raise RuntimeError(f"{self.ROLE} rank 0 has no peers yet (orchestrator.job calls set_peers)")
        return [getattr(p, method).remote(*args) for p in self.peers]

    def _collect(self, refs: list) -> list:
        """The peers' results; TimeoutError past `timeout_s` (run.phase_timeout_s)."""
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"a {self.ROLE} rank did not finish within {self.timeout_s:g}s") from None
