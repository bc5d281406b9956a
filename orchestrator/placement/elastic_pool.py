"""placement.elastic between steps: the decision (orchestrator/placement/elastic.py, pure) applied to the job.

    pool = ElasticPool(job, rows)       # rows: the run's rows so far (a resume's), the last WINDOW_STEPS kept
    row.update(pool.after_step(row))    # after each step: this step's row (its engines/active set)

After each step of a run with placement.elastic the pool asks `decide_pool` and carries it out: `Job.add_rollout`
(an engine in a placement group of its own, synced and verified on the current version before it samples) or
`Job.retire_rollout` (the last engine leaves; a collective weight-sync group is re-formed without it). It prints the
decision's one line and returns the step's `elastic/*` fields: `elastic/added`, `elastic/retired` (0 or 1; Prometheus
`rl_orch_elastic_decisions_total{action}`), `elastic/add_failed` (the group could not be placed), `elastic/change_s`
(seconds the change took), `elastic/predicted_step_s` (the prediction at the count chosen). An engine more that would
pay but finds no room asks Ray's autoscaler for its group (`ask_autoscaler`: KubeRay's worker group grows up to
worker.maxReplicas, deploy/helm; the next decisions find the room).

Before deciding, engines on nodes Ray is draining (orchestrator/placement/drain.py) leave, any index (the last engine
takes the leaving one's index); at rollout.min_workers a new engine is added off those nodes first. That step makes no
other change; `elastic/drained` counts them (also in `elastic/retired`, and `elastic/added` for the ones added first).
Spares there (rollout.spare_workers) start again off those nodes after that, so that an engine added in a drained
one's place gets the room first.
"""
from __future__ import annotations

import time
from collections import deque

from orchestrator.placement.config import engine_range
from orchestrator.placement.drain import draining_nodes, engines_on_nodes, room_for_group
from orchestrator.placement.elastic import WINDOW_STEPS, decide_pool
from orchestrator.placement.groups import PlacementError
from orchestrator.placement.plan import engine_group


ADD_BACKOFF_STEPS = 8  # after a failed add, steps before the next try (a group that cannot be placed costs
# placement.timeout_s per try)


class ElasticPool:
    """Adds and retires the job's rollout engines from the run's measured steps (module docstring)."""

    def __init__(self, job, rows: list[dict]):
        self.job = job
        self.rows: deque = deque(rows[-WINDOW_STEPS:], maxlen=WINDOW_STEPS)
        self.step = 0
        self.add_blocked_until = 0  # the step from which an add is tried again after a failed one

    def room_for_engine(self, draining=()) -> bool:
        """Whether one node that is not being drained (`draining`: node ids) has the resources of one more engine's
        placement group free now (Ray's per-node view: the reservation itself confirms it, within
        placement.timeout_s)."""
        return room_for_group(self._new_engine_bundles(), draining)

    def _new_engine_bundles(self) -> list[dict]:
        """The bundles of one more engine's placement group (`engine_group`)."""
        return [dict(b) for b in engine_group(self.job.cfg, len(self.job.actors.rollout), 0)[0].bundles]

    def after_step(self, row: dict) -> dict:
        """Decide on the last WINDOW_STEPS rows, `row` (this step's) the last, and carry the decision out; returns
        the `elastic/*` fields of the step's row. Engines on nodes being drained go first (`_drain`; no other change
        that step). A failed add (its group not placed, its engine not started or not verified: the job is left as
        it was) is counted and printed, and no add is tried for ADD_BACKOFF_STEPS steps (the autoscaler is asked for
        the room meanwhile)."""
        self.rows.append(row)
        self.step = row.get("step", 0)
        fields = {"elastic/added": 0, "elastic/retired": 0, "elastic/drained": 0}
        draining = draining_nodes()
        t0 = time.perf_counter()
        drained, drain_wants_room = self._drain(draining, fields)
        if drained:
            fields["elastic/change_s"] = time.perf_counter() - t0
            self.ask_autoscaler(one_more=drain_wants_room)
            self._move_spares(draining)
            return fields
        engines = len(self.job.actors.rollout)  # now: an engine may have left since the row was measured
        room = self.step >= self.add_blocked_until and self.room_for_engine(draining)
        decision = decide_pool(list(self.rows), self.job.cfg, engines, room)
        print(decision.why, flush=True)
        chosen = {"add": engines + 1, "retire": engines - 1}.get(decision.action, engines)
        if chosen in decision.predicted:
            fields["elastic/predicted_step_s"] = decision.predicted[chosen]
        if decision.action == "add":
            if not self._add(decision.why.split(": ", 1)[-1], fields):
                decision.wants_room = True
        elif decision.action == "retire":
            self.job.retire_rollout(decision.why.split(": ", 1)[-1])
            fields["elastic/retired"] = 1
        if decision.action != "hold":
            fields["elastic/change_s"] = time.perf_counter() - t0
        self.ask_autoscaler(one_more=decision.wants_room or drain_wants_room)
        self._move_spares(draining)
        return fields

    def _move_spares(self, draining) -> None:
        """Spares on nodes being drained start again off them (orchestrator/placement/spares.py `move_off`), after the
        engines there left: an engine added in a drained one's place gets the room first."""
        if draining and self.job.spares is not None:
            self.job.spares.move_off(draining)

    def _add(self, why: str, fields: dict) -> bool:
        """`Job.add_rollout(why)`; a failure is printed, counted (`elastic/add_failed`) and backs adds off. An
        overlapped sync in flight (a stream's) is verified first, outside: its failure stops the run as it would at
        the next sync."""
        self.job.settle_sync(keep=True)
        try:
            self.job.add_rollout(why)
            fields["elastic/added"] += 1
            return True
        except Exception as e:  # noqa: BLE001 - an add is optional: the run goes on at its count
            what = "could not be placed" if isinstance(e, PlacementError) else "failed"
            print(f"placement.elastic: the new engine {what} ({type(e).__name__}: {e}); no add for "
                  f"{ADD_BACKOFF_STEPS} steps", flush=True)
            fields["elastic/add_failed"] = 1
            self.add_blocked_until = self.step + ADD_BACKOFF_STEPS
            return False

    def _drain(self, draining: dict[str, int], fields: dict) -> tuple[bool, bool]:
        """Let the engines on nodes being drained go, the highest index first: above rollout.min_workers an engine
        retires; at the minimum a new engine is added first (off the drained nodes: Ray places nothing new there),
        and when that add fails the engine stays (it is handled as lost when its node goes). Returns (whether an
        engine was drained: `elastic/drained`, `elastic/retired`, `elastic/added` counted in `fields`; whether one
        stays for want of room: the autoscaler is asked for it)."""
        on, wants_room = (engines_on_nodes(self.job.actors, draining) if draining else {}), False
        for k in sorted(on, reverse=True):
            node, deadline = on[k], draining[on[k]]
            when = f", deadline in {deadline / 1e3 - time.time():.0f} s" if deadline else ""
            why = f"its node {node[:12]} is being drained{when}"
            if len(self.job.actors.rollout) <= engine_range(self.job.cfg)[0]:
                room = self.step >= self.add_blocked_until and self.room_for_engine(draining)
                print(f"placement.elastic: rollout worker {k}: {why}; at rollout.min_workers: "
                      + ("adding an engine first" if room else "no room for another engine: it stays until its node "
                         "goes (then handled as lost)"), flush=True)
                if not (room and self._add(f"in place of rollout worker {k}, {why}", fields)):
                    wants_room = True
                    continue
            print(f"placement.elastic: retiring rollout worker {k}: {why}", flush=True)
            self.job.retire_rollout(why, k)
            fields["elastic/retired"] += 1
            fields["elastic/drained"] += 1
        return fields["elastic/drained"] > 0, wants_room

    def ask_autoscaler(self, one_more: bool) -> None:
        """Tell Ray's autoscaler (KubeRay in-tree, a cluster launcher's; a hint, a no-op without one) the bundles the
        job wants: every placement group's, plus one more engine's group when `one_more`. The request stands until
        the next one, so after a change it is set to the job as it is (an idle node may then go)."""
        from ray.autoscaler.sdk import request_resources

        plan = self.job.actors.plan
        bundles = [dict(b) for g in plan.groups for b in g.bundles]
        if one_more:
            bundles += self._new_engine_bundles()
        request_resources(bundles=bundles)
