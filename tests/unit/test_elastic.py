"""placement.elastic's decision (orchestrator/placement/elastic.py, pure): the engine count the sizer's model prefers
from the run's own rows, bounded by the range, the cluster's room and the cool-down; and its config checks."""
from __future__ import annotations

import pytest

from types import SimpleNamespace

from orchestrator.config import ConfigError, load_config
from orchestrator.placement.elastic import ADD_GAIN, decide_pool, steps_at_count

ELASTIC = ["placement.elastic=true", "rollout.max_workers=3", "trainer.total_steps=20", "sizing.warmup_steps=2"]


def _cfg(*extra):
    return load_config("configs/grpo_arith_cpu.yaml", [*ELASTIC, *extra])


def _rows(*spans):
    """Rows of consecutive steps: each span (engines, steps, generate s, train s)."""
    rows, step = [], 0
    for engines, steps, generate, train in spans:
        for _ in range(steps):
            step += 1
            rows.append({"step": step, "engines/active": engines, "timing/generate_s": generate,
                         "timing/train_s": train, "timing/weight_sync_s": 0.0})
    return rows


def test_a_rollout_bound_run_adds_an_engine_when_the_cluster_has_room():
    # one measured size: generation is assumed to scale ideally (10 s at 1 engine -> 5 s at 2): 12 s -> 7 s
    d = decide_pool(_rows((1, 3, 10.0, 2.0)), _cfg(), engines=1, room=True)
    assert d.action == "add" and d.predicted[1] == pytest.approx(12.0) and d.predicted[2] == pytest.approx(7.0)
    assert "adding an engine: 2 engines predicted 7 s per step against 12 s at 1" in d.why
    held = decide_pool(_rows((1, 3, 10.0, 2.0)), _cfg(), engines=1, room=False)
    assert held.action == "hold" and "no room for another engine" in held.why and held.wants_room
    assert not d.wants_room


def test_an_engine_that_did_not_pay_is_retired_on_the_next_fit():
    # a second engine on the same cores generated no faster: the two sizes fit a serial generate, 1 engine is as fast
    rows = _rows((1, 3, 10.0, 2.0), (2, 3, 10.0, 2.0))
    d = decide_pool(rows, _cfg(), engines=2, room=True)
    assert d.action == "retire" and d.predicted[1] == pytest.approx(d.predicted[2], rel=1e-6)
    assert "not rollout-bound" in d.why
    # one engine fewer is faster: the weight sync grew with its receivers (3 s at 2 engines against 1 s at 1) and the
    # generation did not shrink (as benchmarks/elastic.py measures on one 2-core host)
    rows = [dict(r, **{"timing/weight_sync_s": 1.0 + 2.0 * (r["engines/active"] - 1)})
            for r in _rows((1, 3, 10.0, 2.0), (2, 3, 10.0, 2.0))]
    d = decide_pool(rows, _cfg(), engines=2, room=True)
    assert d.action == "retire" and d.predicted[1] < d.predicted[2] and "(faster: the engines compete" in d.why


def test_a_trainer_bound_run_retires_down_to_the_minimum_and_no_further():
    rows = _rows((2, 3, 0.1, 10.0))  # generation is 1% of the step: one engine fewer costs 0.1 s of 10.1 (< 2%)
    assert decide_pool(rows, _cfg(), engines=2, room=True).action == "retire"
    at_min = decide_pool(_rows((1, 3, 0.1, 10.0)), _cfg(), engines=1, room=True)
    assert at_min.action == "hold" and set(at_min.predicted) == {1, 2}  # 2: within max, gain below ADD_GAIN
    assert at_min.predicted[2] > at_min.predicted[1] * (1 - ADD_GAIN)


def test_decisions_wait_for_the_cool_down_and_the_warm_up_and_respect_the_maximum():
    rows = _rows((1, 3, 10.0, 2.0), (2, 1, 5.0, 2.0))
    assert steps_at_count(rows, 2) == 1 and steps_at_count(rows, 1) == 0
    d = decide_pool(rows, _cfg(), engines=2, room=True)
    assert d.action == "hold" and "1 step(s) measured at this count" in d.why and d.predicted == {}
    early = decide_pool(_rows((1, 1, 10.0, 2.0)), _cfg("sizing.warmup_steps=5"), engines=1, room=True)
    assert early.action == "hold"
    top = decide_pool(_rows((3, 3, 10.0, 2.0)), _cfg(), engines=3, room=True)
    assert top.action == "hold" and 4 not in top.predicted  # rollout.max_workers=3
    assert decide_pool(_rows((4, 3, 10.0, 2.0)), _cfg(), engines=4, room=True).action == "retire"


def test_a_one_step_off_run_is_modelled_with_its_generation_beside_training():
    # generation 10 s of the 12 s train (async/generate_s; timing/generate_s is the exposed wait, 0 here): a
    # synchronous run adds an engine (12 + 10 -> 12 + 5), a one-step-off run is trainer-bound and does not
    rows = [dict(r, **{"async/generate_s": 10.0, "timing/generate_s": 0.0}) for r in _rows((1, 3, 10.0, 12.0))]
    off = _cfg("rollout.mode=one_step_off", "algo.max_staleness=1")
    held = decide_pool(rows, off, engines=1, room=True)
    assert held.action == "hold" and held.predicted[2] == pytest.approx(held.predicted[1])
    assert decide_pool(_rows((1, 3, 10.0, 12.0)), _cfg(), engines=1, room=True).action == "add"
    # rollout-bound even beside training (generation 20 s against a 12 s train): one more engine pays
    rows = [dict(r, **{"async/generate_s": 20.0, "timing/generate_s": 8.0}) for r in _rows((1, 3, 20.0, 12.0))]
    d = decide_pool(rows, off, engines=1, room=True)
    assert d.action == "add" and d.predicted[2] < d.predicted[1] * (1 - ADD_GAIN)


def test_rows_the_sizer_cannot_use_hold_and_say_why():
    d = decide_pool([{"step": 5, "engines/active": 1}] * 3, _cfg(), engines=1, room=True)
    assert d.action == "hold" and "the sizer cannot model this run" in d.why


@pytest.mark.parametrize("extra, match", [
    (["env.name=guessing", "env.kwargs={low: 1, high: 10, max_turns: 2}", "env.placement=actor"],
     "placement.elastic=true needs env.placement=thread"),
    (["placement.mode=colocated", "weight_sync.strategy=vllm_ipc"], r"rollout.max_workers \(placement.elastic\) x "),
    (["placement.mode=colocated", "placement.resource=GPU"], "colocated on GPUs needs placement.rollout_per_worker=1"),
    (["rollout.max_workers=1"], "nothing can change"),
    (["trainer.total_steps=2"], "the first decision would never run"),
    (["placement.auto=true"], "placement.elastic=true with placement.auto=true"),
    (["sizing.cooldown_steps=1"], "sizing.cooldown_steps=1 must be >= 2"),
    (["rollout.min_workers=2"], "rollout.min_workers=2 is above rollout.num_workers=1"),
])
def test_elastic_configs_it_cannot_run_are_refused_naming_the_key(extra, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(*extra)


def test_the_engine_range_defaults_to_the_starting_count_and_is_checked_without_elastic_too():
    cfg = load_config("configs/grpo_arith_cpu.yaml")
    assert (cfg.rollout.min_workers, cfg.rollout.max_workers, cfg.placement.elastic) == (0, 0, False)
    with pytest.raises(ConfigError, match="rollout.max_workers=1 is below rollout.num_workers=2"):
        load_config("configs/grpo_arith_cpu.yaml", ["rollout.num_workers=2", "rollout.max_workers=1"])
    with pytest.raises(ConfigError, match="rollout.max_workers=4 set with placement.elastic=false: the engine count "
                                          "stays at rollout.num_workers=2"):
        load_config("configs/grpo_arith_cpu.yaml", ["rollout.num_workers=2", "rollout.max_workers=4"])
    assert load_config("configs/grpo_arith_cpu.yaml", ["rollout.num_workers=2", "rollout.max_workers=2"])


def test_elastic_engines_get_placement_groups_of_their_own_so_a_retired_one_frees_its_devices():
    from orchestrator.placement.plan import engine_group, plan_job

    cfg = _cfg("rollout.num_workers=2", "placement.rollout_per_worker=0.25")
    plan = plan_job(cfg, pin=False)
    assert [g.name for g in plan.groups] == ["rl-orch-job", "rl-orch-rollout-0", "rl-orch-rollout-1"]
    assert [(s.group, s.bundle, s.resources) for s in plan.slots["rollout"]] == [(1, 0, {"CPU": 0.25}),
                                                                                  (2, 0, {"CPU": 0.25})]
    assert len(plan.groups[0].bundles) == 2  # the job group: the trainer's and the reward actor's bundles only
    group, slot = engine_group(cfg, 5, 7, prefix="rl-orch-engine")  # an engine added while the run goes
    assert (group.name, group.strategy, group.bundles, slot.group) == ("rl-orch-engine-5", "STRICT_PACK",
                                                                        [{"CPU": 0.25}], 7)
    tp = _cfg("rollout.tensor_parallel_size=2", "placement.rollout_per_worker=0.5")
    group, slot = engine_group(tp, 0, 1)
    assert group.bundles == [{"CPU": 0.5}] * 2 and slot.resources == {} and slot.worker_bundles == [0, 1]


def test_a_colocated_elastic_run_adds_engines_in_groups_of_their_own_that_do_not_sleep():
    """placement.mode=colocated: the starting engines share the trainer ranks' devices (the job group) and sleep while
    the trainer trains; an added engine has a group of its own (orchestrator/placement/modes.py)."""
    from orchestrator.placement.plan import engine_group, plan_job, shares_device

    cfg = _cfg("placement.mode=colocated", "placement.resource=fake_gpu", "placement.fake_gpus=2",
               "trainer.num_workers=2", "rollout.num_workers=2", "rollout.max_workers=3", "rollout.min_workers=1")
    plan = plan_job(cfg, pin=False)
    assert [g.name for g in plan.groups] == ["rl-orch-job"]
    assert [(s.group, s.bundle, shares_device(cfg, s)) for s in plan.slots["rollout"]] == [(0, 0, True), (0, 1, True)]
    group, slot = engine_group(cfg, 1, 1, prefix="rl-orch-engine")
    assert group.bundles == [{"fake_gpu": cfg.placement.rollout_per_worker}] and not shares_device(cfg, slot)
    assert not shares_device(_cfg(), plan_job(_cfg(), pin=False).slots["rollout"][0])  # disaggregated: never
    rollout_bound = decide_pool(_rows((2, 3, 10.0, 2.0)), cfg, engines=2, room=True)  # generate 10 s, train 2 s
    assert rollout_bound.action == "add" and rollout_bound.predicted[3] < rollout_bound.predicted[2]
    assert decide_pool(_rows((2, 3, 0.2, 20.0)), cfg, engines=2, room=True).action == "retire"  # trainer-bound


def test_time_slice_sleeps_only_the_engines_that_share_a_device_and_replaces_a_lost_one(monkeypatch):
    import orchestrator.placement.modes as modes
    from orchestrator.runtime.faults import EnginesLost

    slots = [SimpleNamespace(group=0), SimpleNamespace(group=2), SimpleNamespace(group=0)]
    cfg = SimpleNamespace(placement=SimpleNamespace(mode="colocated"), run=SimpleNamespace(phase_timeout_s=5.0))
    job = SimpleNamespace(cfg=cfg, actors=SimpleNamespace(rollout=["e0", "e1", "e2"],
                                                          plan=SimpleNamespace(slots={"rollout": slots})))
    calls, lost = [], {"e2"}

    def replace_rollout(k, why):
        job.actors.rollout[k] = f"{job.actors.rollout[k]}'"

    def gather(refs, timeout, method, key):
        dead = [k for k, (h, _) in refs.items() if h in lost]
        lost.clear()
        if dead:
            raise EnginesLost({k: "died" for k in dead}, {k: h for k, (h, _) in refs.items() if k not in dead})
        return {k: h for k, (h, _) in refs.items()}

    job.replace_rollout = replace_rollout
    monkeypatch.setattr(modes, "call_engine", lambda workers, k, window, method, *a: (workers[k], calls.append(
        (window, workers[k]))))
    monkeypatch.setattr(modes, "gather_engines", gather)
    row = {}
    modes.time_slice(job, "train", row)
    assert calls == [("sleep", "e0"), ("sleep", "e2"), ("sleep", "e2'")] and "colocate/sleep_s" in row
    cfg.placement.mode = "disaggregated"
    modes.time_slice(job, "weight_sync", row)
    assert len(calls) == 3 and "colocate/wake_s" not in row
    # a lost engine that leaves instead (placement.elastic): the last one takes its index and, having answered, is not
    # called again
    cfg.placement.mode, calls[:] = "colocated", []
    job.actors.rollout, slots[1] = ["e0", "e1", "e2"], SimpleNamespace(group=0)
    lost.add("e0")
    job.replace_rollout = lambda k, why: job.actors.rollout.__setitem__(k, job.actors.rollout.pop())
    modes.time_slice(job, "weight_sync", row)
    assert calls == [("wake", "e0"), ("wake", "e1"), ("wake", "e2")] and job.actors.rollout == ["e2", "e1"]


def test_spare_engines_are_refused_where_they_have_no_group_of_their_own():
    assert load_config("configs/grpo_arith_cpu.yaml", ["rollout.spare_workers=1"]).rollout.spare_workers == 1
    with pytest.raises(ConfigError, match="rollout.spare_workers=1 needs placement.mode=disaggregated"):
        load_config("configs/grpo_arith_cpu.yaml", ["rollout.spare_workers=1", "placement.mode=colocated"])


def test_the_pool_decides_on_a_window_of_the_last_steps_and_carries_the_decision_out(monkeypatch):
    import orchestrator.placement.elastic_pool as elastic_pool
    from orchestrator.placement.elastic import WINDOW_STEPS, PoolDecision

    seen, calls = [], []

    def decide(rows, cfg, engines, room):
        seen.append((len(rows), rows[-1]["step"], engines, room))
        return PoolDecision("add" if len(seen) == 1 else "retire", engines, "placement.elastic: why", {2: 7.0, 1: 9.0})

    class Job:
        cfg = _cfg()
        actors = SimpleNamespace(rollout=["engine 0"])

        def settle_sync(self, keep=False):  # no overlapped sync in flight here
            return {}

        def add_rollout(self, why):
            calls.append(("add", why))
            self.actors.rollout.append("engine 1")

        def retire_rollout(self, why):
            calls.append(("retire", why))
            self.actors.rollout.pop()

    monkeypatch.setattr(elastic_pool, "decide_pool", decide)
    monkeypatch.setattr(elastic_pool.ElasticPool, "room_for_engine", lambda self, draining=(): True)
    monkeypatch.setattr(elastic_pool, "draining_nodes", dict)
    monkeypatch.setattr(elastic_pool.ElasticPool, "ask_autoscaler", lambda self, one_more: calls.append(one_more))
    pool = elastic_pool.ElasticPool(Job(), _rows((1, WINDOW_STEPS + 10, 10.0, 2.0)))
    first = pool.after_step({"step": 100, "engines/active": 1})
    second = pool.after_step({"step": 101, "engines/active": 2})
    assert seen == [(WINDOW_STEPS, 100, 1, True), (WINDOW_STEPS, 101, 2, True)]  # the window, the new row last
    assert calls == [("add", "why"), False, ("retire", "why"), False]
    assert (first["elastic/added"], first["elastic/predicted_step_s"]) == (1, 7.0) and "elastic/change_s" in first
    assert (second["elastic/retired"], second["elastic/predicted_step_s"]) == (1, 9.0)


def test_a_failed_add_is_counted_and_not_tried_again_for_a_while(monkeypatch):
    import orchestrator.placement.elastic_pool as elastic_pool
    from orchestrator.placement.elastic import PoolDecision

    rooms, asked = [], []
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: rooms.append(room) or
                        PoolDecision("add" if room else "hold", engines, "placement.elastic: why"))
    monkeypatch.setattr(elastic_pool.ElasticPool, "room_for_engine", lambda self, draining=(): True)
    monkeypatch.setattr(elastic_pool, "draining_nodes", dict)
    monkeypatch.setattr(elastic_pool.ElasticPool, "ask_autoscaler", lambda self, one_more: asked.append(one_more))

    class Job:
        cfg, actors = _cfg(), SimpleNamespace(rollout=["engine 0"])

        def settle_sync(self, keep=False):  # no overlapped sync in flight here
            return {}

        def add_rollout(self, why):
            raise TimeoutError("the new engine did not start")  # not only PlacementError: any failed add

    pool = elastic_pool.ElasticPool(Job(), [])
    first = pool.after_step({"step": 5, "engines/active": 1})
    assert first["elastic/add_failed"] == 1 and first["elastic/added"] == 0 and asked == [True]
    for step in range(6, 6 + elastic_pool.ADD_BACKOFF_STEPS):
        pool.after_step({"step": step, "engines/active": 1})
    assert rooms == [True] + [False] * (elastic_pool.ADD_BACKOFF_STEPS - 1) + [True]  # the back-off, then a try


def test_steps_that_lost_an_engine_are_left_out_of_the_fit():
    from orchestrator.placement.elastic import predict_counts

    rows = _rows((1, 3, 10.0, 2.0))
    slow = dict(rows[-1], step=4, **{"timing/generate_s": 100.0, "rollout/worker_restarts": 1})
    assert predict_counts(rows + [slow], _cfg(), [1])[0] == predict_counts(rows, _cfg(), [1])[0]


class _DrainJob:
    """A job stand-in for the pool's drain: records add_rollout / retire_rollout(why, k)."""

    def __init__(self, engines: int, *extra):
        self.cfg, self.calls, self.spares = _cfg(*extra), [], None
        self.actors = SimpleNamespace(rollout=[f"engine {k}" for k in range(engines)])

    def settle_sync(self, keep=False):  # no overlapped sync in flight here
        return {}

    def add_rollout(self, why):
        self.calls.append(("add", why))
        self.actors.rollout.append("new engine")

    def retire_rollout(self, why, k=None):
        self.calls.append(("retire", k, why))
        last = self.actors.rollout.pop()
        if k < len(self.actors.rollout):
            self.actors.rollout[k] = last  # the last engine takes the leaving one's index


def _drain_pool(monkeypatch, job, on: dict, room: bool):
    import orchestrator.placement.elastic_pool as elastic_pool
    from orchestrator.placement.elastic import PoolDecision

    decided, asked = [], []
    monkeypatch.setattr(elastic_pool, "draining_nodes", lambda: {node: 0 for node in on.values()})
    monkeypatch.setattr(elastic_pool, "engines_on_nodes", lambda actors, nodes: dict(on))
    monkeypatch.setattr(elastic_pool.ElasticPool, "room_for_engine", lambda self, draining=(): room)
    monkeypatch.setattr(elastic_pool.ElasticPool, "ask_autoscaler", lambda self, one_more: asked.append(one_more))
    monkeypatch.setattr(elastic_pool, "decide_pool", lambda rows, cfg, engines, room: decided.append(engines) or
                        PoolDecision("hold", engines, "placement.elastic: hold"))
    return elastic_pool.ElasticPool(job, []), decided, asked


def test_engines_on_a_drained_node_leave_before_the_decision_any_index(monkeypatch):
    job = _DrainJob(3)
    pool, decided, asked = _drain_pool(monkeypatch, job, {0: "node-a", 2: "node-a"}, room=True)
    row = pool.after_step({"step": 5, "engines/active": 3})
    assert [c[:2] for c in job.calls] == [("retire", 2), ("retire", 0)]  # the highest index first
    assert "its node node-a is being drained" in job.calls[0][2]
    assert job.actors.rollout == ["engine 1"] and decided == [] and asked == [False]  # no other change that step
    assert (row["elastic/drained"], row["elastic/retired"], row["elastic/added"]) == (2, 2, 0)


def test_a_drained_engine_at_the_minimum_is_replaced_first_or_stays_without_room(monkeypatch):
    job = _DrainJob(1)
    pool, decided, asked = _drain_pool(monkeypatch, job, {0: "node-a"}, room=True)
    row = pool.after_step({"step": 5, "engines/active": 1})
    assert [c[:2] for c in job.calls] == [("add", "in place of rollout worker 0, its node node-a is being drained"),
                                          ("retire", 0)]
    assert job.actors.rollout == ["new engine"] and (row["elastic/added"], row["elastic/drained"]) == (1, 1)
    job = _DrainJob(1)
    pool, decided, asked = _drain_pool(monkeypatch, job, {0: "node-a"}, room=False)
    row = pool.after_step({"step": 5, "engines/active": 1})
    assert job.calls == [] and row["elastic/drained"] == 0  # it stays: handled as lost when its node goes
    assert decided == [1] and asked == [True]  # the decision still runs; the autoscaler is asked for a node


def test_room_is_a_node_not_being_drained_that_holds_the_whole_group(monkeypatch):
    from ray._private import state

    from orchestrator.placement.drain import room_for_group

    free = {"a": {"slot": 1.0}, "b": {"slot": 0.5, "CPU": 1.0}}
    monkeypatch.setattr(state, "available_resources_per_node", lambda: free)
    assert room_for_group([{"slot": 1.0}]) and not room_for_group([{"slot": 1.0}], draining={"a": 0})
    assert not room_for_group([{"slot": 0.5}] * 2, draining={"a"})  # STRICT_PACK: one node holds every bundle
    assert room_for_group([{"slot": 0.5}, {"CPU": 1.0}], draining={"a"})


def test_engines_on_nodes_reads_each_engines_own_bundles(monkeypatch):
    """An engine is on a node when one of its own bundles is: a colocated engine's bundle in the job group (whose other
    bundles hold the trainer ranks), a TP engine's worker bundles."""
    import orchestrator.placement.drain as drain

    slots = [SimpleNamespace(group=0, bundle=1, worker_bundles=[]), SimpleNamespace(group=1, bundle=0, worker_bundles=[]),
             SimpleNamespace(group=2, bundle=0, worker_bundles=[0, 1])]
    actors = SimpleNamespace(plan=SimpleNamespace(slots={"rollout": slots}), pgs=["job", "pg1", "pg2"],
                             rollout=["e0", "e1", "e2"])
    where = {"job": {0: "a", 1: "b", 2: "c"}, "pg1": {0: "a"}, "pg2": {0: "c", 1: "a"}}
    monkeypatch.setattr(drain.ray.util, "placement_group_table", lambda pg: {"bundles_to_node_id": where[pg]})
    assert drain.engines_on_nodes(actors, {"a": 0}) == {1: "a", 2: "a"}  # not engine 0: the job group's bundle 0
    assert drain.engines_on_nodes(actors, {"b": 0}) == {0: "b"}
    assert drain.group_nodes("job") == {"a", "b", "c"}
    assert drain.engines_on_nodes(actors, {}) == {}


def test_spares_on_a_drained_node_start_again_off_it_and_a_spare_in_a_shared_bundle_stays(monkeypatch):
    import sys

    import orchestrator.placement.spares as spares_mod
    from orchestrator.placement.plan import GroupPlan

    rollout_slot = SimpleNamespace(group=0, bundle=1)  # a lost engine's old slot in the job group, now spare 2's
    slots = {"trainer": [SimpleNamespace(group=0, bundle=0)], "rollout": [SimpleNamespace(group=1, bundle=0)],
             "spare": [SimpleNamespace(group=2, bundle=0), SimpleNamespace(group=3, bundle=0), rollout_slot]}
    groups = [GroupPlan("rl-orch-job", [{"CPU": 1}] * 2, "PACK")] + [
        GroupPlan(f"g{i}", [{"CPU": 0.5}], "STRICT_PACK") for i in (1, 2, 3)]
    actors = SimpleNamespace(plan=SimpleNamespace(slots=slots, groups=groups), pgs=["pg0", "pg1", "pg2", "pg3"],
                             all=["s0", "s1", "s2"])
    where = {"pg0": {"a"}, "pg1": {"b"}, "pg2": {"a"}, "pg3": {"c"}}
    killed, removed, made, started = [], [], [], []
    monkeypatch.setattr(spares_mod, "group_nodes", lambda pg: where.get(pg, set()))
    monkeypatch.setattr(spares_mod.ray, "kill", killed.append)
    monkeypatch.setattr(spares_mod, "remove_groups", removed.extend)
    monkeypatch.setattr(sys.modules["ray.util.placement_group"], "placement_group", lambda bundles, strategy, name: made.append(name) or f"new-{name}")

    class Handle(str):
        ready = SimpleNamespace(remote=lambda: "ref")

    monkeypatch.setattr(spares_mod, "start_rollout_worker", lambda cfg, plan, pgs, j, path, start, role: started.append(
        (j, pgs[plan.slots[role][j].group], role)) or Handle(f"s{j}'"))
    spares = spares_mod.SpareEngines(SimpleNamespace(), actors, "/m")
    spares.handles, spares.readies = ["s0", "s1", "s2"], ["r0", "r1", "r2"]
    assert spares.refill({"a": 0}) == 1  # spare 0 (its own group on a); spare 2 shares the job group on a: stays
    assert killed == ["s0"] and removed == ["pg2"] and made == ["g2"]
    assert started == [(0, "new-g2", "spare")] and actors.pgs[2] == "new-g2" and spares.handles[0] == "s0'"
    assert "s0" not in actors.all and "s0'" in actors.all
    assert spares.refill({}) == 0 and spares.refill({"z": 0}) == 0
    spares.to_refill = [1]  # spare 1 took a lost engine's place this step: it is an engine now, not killed
    assert spares.refill({"c": 0}) == 1  # its slot (g3, on c) is made again off the drained node, then launched
    assert killed == ["s0"] and removed == ["pg2", "pg3"] and made == ["g2", "g3"]
    assert started[-1] == (1, "new-g3", "spare") and actors.pgs[3] == "new-g3"


def test_the_multi_turn_router_follows_the_engines_between_steps():
    """placement.elastic with a multi-turn env: the sticky router's workers are the job's engines at each launch (an
    engine added is routed to; the last index goes with an engine that left)."""
    from orchestrator.rollout.multi_turn_source import MultiTurnSource
    from orchestrator.rollout.types import PromptRequest

    cfg = _cfg("env.name=guessing", "env.kwargs={low: 1, high: 10, max_turns: 2}")
    workers = ["e0"]
    source = MultiTurnSource(cfg, workers, wait=lambda refs: refs)
    requests = [PromptRequest(group_id=g, prompt_ids=[1, 2], answer="a", prompt="p", seed=g) for g in range(8)]

    def routed():
        shards = source.route(requests)
        for r in requests:
            source.router.release(r.group_id)
        return sorted(shards)

    assert routed() == [0]
    workers.append("e1")  # an engine added after the step
    assert routed() == [0, 1] and source.router.workers == [0, 1]
    workers.pop()  # one retired
    assert routed() == [0] and source.router.workers == [0]


def test_a_stream_run_is_modelled_with_its_engines_busy_seconds():
    """rollout.mode=stream: the sizer's "stream" mode on the rows' engine busy seconds (rollout/worker_generate_s_mean;
    timing/generate_s is the trainer's wait): generation that keeps up with training gets no engine, one that does
    not gets one."""
    stream = _cfg("rollout.mode=stream", "algo.max_staleness=1")

    def rows(busy: float, train: float):
        return [dict(r, **{"async/buffer_groups": 2.0, "rollout/worker_generate_s_mean": busy, "timing/generate_s": 0.5})
                for r in _rows((1, 3, busy, train))]

    assert decide_pool(rows(4.0, 12.0), stream, engines=1, room=True).action == "hold"  # trainer-bound
    d = decide_pool(rows(24.0, 12.0), stream, engines=1, room=True)
    assert d.action == "add" and d.predicted[2] < d.predicted[1] * 0.95


def test_an_overlapped_syncs_per_engine_state_follows_an_engine_that_changed_index():
    """A stream's overlapped sync keys its calls, strikes and losses by engine index; when engine 1 leaves and the last
    (3) takes its index (Job._remove_engine), the leaving one's state goes and the moved one's follows it."""
    from orchestrator.weight_sync.overlapped import OverlappedSyncs

    syncs = OverlappedSyncs(syncer=None, retries=1)
    syncs.pending = SimpleNamespace(loads={0: "l0", 1: "l1", 3: "l3"}, probes={1: "p1", 3: "p3"})
    syncs.strikes, syncs.lost = {1: 1, 3: 1}, {1: "died"}
    syncs.forget(1)
    syncs.renumber(3, 1)
    assert syncs.pending.loads == {0: "l0", 1: "l3"} and syncs.pending.probes == {1: "p3"}
    assert syncs.strikes == {1: 1} and syncs.lost == {}


def test_a_trainer_node_resource_keeps_the_job_group_on_the_nodes_that_advertise_it():
    """placement.trainer_node_resource: every bundle of the job group (trainer, reference, reward; colocated: the
    shared devices) asks a thousandth of it; engines in groups of their own do not (preemptible nodes take them)."""
    from orchestrator.placement.plan import TRAINER_NODE_SHARE, engine_group, plan_job

    cfg = _cfg("placement.trainer_node_resource=stable", "algo.kl_coef=0.1")
    plan = plan_job(cfg, pin=False)
    assert all(b.get("stable") == TRAINER_NODE_SHARE for b in plan.groups[0].bundles) and len(plan.groups[0].bundles) == 3
    assert all("stable" not in b for g in plan.groups[1:] for b in g.bundles)
    assert "stable" not in engine_group(cfg, 1, 2)[0].bundles[0]
    assert all("stable" not in s.resources for ss in plan.slots.values() for s in ss)  # the actors ask their own
    colocated = plan_job(_cfg("placement.trainer_node_resource=stable", "placement.mode=colocated"), pin=False)
    assert all(b.get("stable") == TRAINER_NODE_SHARE for b in colocated.groups[0].bundles)
    for bad in ("GPU", "CPU"):
        with pytest.raises(ConfigError, match=f"placement.trainer_node_resource='{bad}': name a custom resource"):
            _cfg(f"placement.trainer_node_resource={bad}")


def test_a_placement_failure_says_the_job_group_goes_only_to_nodes_advertising_the_trainer_resource(monkeypatch):
    import orchestrator.placement.groups as groups
    from orchestrator.placement.plan import plan_job

    plan = plan_job(_cfg("placement.trainer_node_resource=stable"), pin=False)
    monkeypatch.setattr(groups.ray, "cluster_resources", lambda: {"CPU": 8.0})
    msg = groups._gang_message(plan.groups, plan.groups[:1], 5.0, {"CPU": 8.0})
    assert "stable: need 0.002, cluster has 0" in msg and "go only to nodes advertising 'stable'" in msg
