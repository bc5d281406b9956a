"""Spare rollout engines (`rollout.spare_workers`): engines started and kept warm beside the job's, each in a
placement group of its own, that take a lost engine's place at once (docs/elastic.md, docs/faults.md).

    spares = SpareEngines(cfg, actors, model_path)
    spares.start()                       # reserve their groups, start the engines (not waited for)
    handle = spares.take(k)              # a warm spare becomes rollout worker k, or None when none is ready
    spares.refill(draining)              # between steps: new spares in the slots taken, spares off drained nodes
    spares.ready()                       # how many are warm now (row key engines/spare)

Most of a replacement's time is a new vLLM engine starting (17-39 s on CPU, minutes for a large model on GPUs); a
spare has started already. Taking it swaps its slot with the lost engine's: the spare becomes worker k in its own
group, and after the step (`refill`) a new spare starts in the lost engine's slot (its bundle, which Ray places again
where the cluster has room), not waited for: started at once, it competed with that step for the host's CPUs. The job then connects and syncs the spare as it does any replacement (verified, probed),
so a spare holds the current weights before it samples; it is not synced while it waits (that would cost every sync
one more receiver). A spare whose group cannot be reserved at start is left out, with a warning. A spare in a group of
its own on a node Ray is draining (orchestrator/placement/drain.py) starts again off it at `refill`: its group is
removed and made again, placed by Ray where there is room (never on a draining node), and it is not taken until its
engine is up there.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import ray

from orchestrator.placement.drain import group_nodes
from orchestrator.placement.groups import PlacementError, remove_groups, reserve_groups
from orchestrator.placement.plan import engine_group
from orchestrator.placement.start import start_rollout_worker


class SpareEngines:
    """The job's spare engines: `handles[j]` in the plan's slot `plan.slots["spare"][j]`, `readies[j]` the ref of its
    `ready` call."""

    def __init__(self, cfg, actors, model_path: Path):
        self.cfg, self.actors, self.model_path = cfg, actors, Path(model_path)
        self.handles: list[Any] = []
        self.readies: list[Any] = []
        self.taken = 0  # spares that took a lost engine's place over the run
        self.to_refill: list[int] = []  # spare slots taken this step: a new spare starts there at `refill`

    def start(self) -> None:
        """Reserve a placement group for each of rollout.spare_workers spares (placement.timeout_s each) and start
        their engines; a group that cannot be reserved leaves that spare out (a warning naming what is missing)."""
        plan, pgs = self.actors.plan, self.actors.pgs
        plan.slots.setdefault("spare", [])
        for j in range(self.cfg.rollout.spare_workers):
            group, slot = engine_group(self.cfg, j, len(plan.groups), prefix="rl-orch-spare")
            try:
                pg = reserve_groups([group], self.cfg.placement.timeout_s, self.cfg.placement.resource)[0]
            except PlacementError as e:
                print(f"WARNING: rollout.spare_workers: spare engine {j} left out: {e}", flush=True)
                continue
            pgs.append(pg)
            plan.groups.append(group)
            plan.slots["spare"].append(slot)
            self._launch(len(plan.slots["spare"]) - 1)

    def _launch(self, j: int) -> None:
        """Start spare j in its slot (not waited for)."""
        # the base model: the spare gets the full current weights when it takes a place (a resumed checkpoint may
        # be pruned by then: checkpoint.keep_last)
        handle = start_rollout_worker(self.cfg, self.actors.plan, self.actors.pgs, j, self.model_path, None,
                                      role="spare")
        if j < len(self.handles):
            self.handles[j], self.readies[j] = handle, handle.ready.remote()
        else:
            self.handles.append(handle)
            self.readies.append(handle.ready.remote())
        self.actors.all.append(handle)

    def ready(self) -> int:
        """Spares whose engine has started (does not wait)."""
        refs = [r for r in self.readies if r is not None]
        if not refs:
            return 0
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return sum(self._ok(r) for r in done)

    @staticmethod
    def _ok(ref) -> bool:
        try:
            ray.get(ref)
            return True
        except Exception:  # noqa: BLE001 - a spare that failed to start is not ready (`take` starts it again)
            return False

    def _alive(self, j: int) -> bool:
        """Whether warm spare j still answers (a spare's node may have gone while it waited)."""
        try:
            ray.get(self.handles[j].pid.remote(), timeout=10)
            return True
        except Exception:  # noqa: BLE001 - dead or not answering: started again at `refill`
            return False

    def take(self, k: int) -> Optional[Any]:
        """A ready spare for rollout worker k, or None (none ready). Its slot and rollout worker k's are swapped: the
        spare is worker k in its own group, and `refill` starts a new spare in k's old slot. The caller kills the
        lost engine first, and connects and syncs the returned handle."""
        refs = [r for r in self.readies if r is not None]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        for j, ref in enumerate(self.readies):
            if ref is None or ref not in done:
                continue
            if self._ok(ref) and self._alive(j):
                return self._swap(j, k)
            ray.kill(self.handles[j])  # failed to start, or died while it waited: a new one at `refill`
            self.readies[j] = None
            self.to_refill.append(j)
        return None

    def _swap(self, j: int, k: int) -> Any:
        plan = self.actors.plan
        handle = self.handles[j]
        plan.slots["rollout"][k], plan.slots["spare"][j] = plan.slots["spare"][j], plan.slots["rollout"][k]
        self.taken += 1
        self.readies[j] = None  # not ready until `refill` starts a new spare in the lost engine's slot
        self.to_refill.append(j)
        return handle

    def refill(self, draining=()) -> int:
        """Start a new spare in each slot taken since the last call (the lost engines' slots: Ray places their bundles
        again where the cluster has room; a slot of its own on a node being drained is made again off it first), and
        move the warm spares on nodes being drained (`draining`: node ids; `move_off`); not waited for. The job calls
        it between steps, so that a new engine's start does not compete with the step that lost an engine. Returns
        how many were started."""
        started, self.to_refill = self.to_refill, []
        moved = self.move_off(draining, skip=started) if draining else 0
        for j in started:
            if draining and self._on(j, draining):
                self._regroup(j)
            self._launch(j)
        return len(started) + moved

    def move_off(self, draining, skip=()) -> int:
        """Warm spares (not in `skip` or taken this step) whose own placement group has a bundle on one of the
        `draining` nodes: killed, the group made again (`_regroup`: pending until Ray places it, never on a draining
        node) and the engine started in it, not waited for (`take` skips it until it is up). A spare in a bundle that
        other actors' group holds (a lost engine's old slot in the job group) stays: when its node goes it is found
        dead and started again. Returns how many moved."""
        moved = 0
        for j in range(min(len(self.handles), len(self.actors.plan.slots.get("spare", [])))):
            if j in self.to_refill or j in skip or not self._on(j, draining):
                continue
            ray.kill(self.handles[j])
            if self.handles[j] in self.actors.all:
                self.actors.all.remove(self.handles[j])
            self._regroup(j)
            self._launch(j)
            moved += 1
            print(f"rollout.spare_workers: spare engine {j} was on a node being drained; starting it again off it",
                  flush=True)
        return moved

    def _on(self, j: int, draining) -> bool:
        """Whether spare slot j has a placement group of its own (no other actor's slot in it) with a bundle on one
        of the `draining` nodes."""
        plan = self.actors.plan
        slot = plan.slots["spare"][j]
        shared = any(s.group == slot.group for ss in plan.slots.values() for s in ss if s is not slot)
        return not shared and bool(group_nodes(self.actors.pgs[slot.group]) & set(draining))

    def _regroup(self, j: int) -> None:
        """Spare slot j's placement group removed and made again with the same bundles (not waited for)."""
        from ray.util.placement_group import placement_group

        plan, pgs = self.actors.plan, self.actors.pgs
        g = plan.slots["spare"][j].group
        remove_groups([pgs[g]])
        pgs[g] = placement_group(plan.groups[g].bundles, strategy=plan.groups[g].strategy, name=plan.groups[g].name)
