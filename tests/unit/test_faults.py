"""Lost rollout workers (orchestrator/runtime/faults.py, the sources' reissue in orchestrator/rollout/source.py, the
job's sync loop): the restart budget, which groups are issued again, and engines lost during a weight sync.
No Ray: fake handles and a fake `wait`."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.config import load_config
from orchestrator.runtime.faults import ENGINE_WINDOWS, EnginesLost, RestartBudget, RestartsExhausted, call_engine, describe, fault_hook
from orchestrator.job import Job
from orchestrator.rollout import PromptRequest, Trajectory
from orchestrator.rollout.single_turn import SingleTurnSource
from orchestrator.weight_sync.syncer import WeightSyncer

CFG = load_config("configs/grpo_arith_cpu.yaml")


class Lost(RuntimeError):
    """Stands for Ray's ActorDiedError."""


def test_the_budget_counts_restarts_over_the_run_then_stops_naming_what_failed():
    budget = RestartBudget(2)
    assert budget.spend("rollout worker 0", "ActorDiedError: killed") == 1
    assert budget.spend("rollout worker 1", "hung") == 2
    with pytest.raises(RestartsExhausted, match=r"rollout worker 0 failed \(oom\).*run.max_restarts=2.*"
                                               r"rollout worker 0 \(ActorDiedError: killed\).*checkpoint.resume=auto"):
        budget.spend("rollout worker 0", "oom")
    assert budget.used == 2 and [w for w, _ in budget.events] == ["rollout worker 0", "rollout worker 1"]
    with pytest.raises(RestartsExhausted, match="max_restarts=0"):
        RestartBudget(0).spend("trainer", "x")


def test_max_restarts_is_a_checked_run_key():
    assert CFG.run.max_restarts == 3
    from orchestrator.config import ConfigError

    with pytest.raises(ConfigError, match="run.max_restarts=-1"):
        load_config("configs/grpo_arith_cpu.yaml", ["run.max_restarts=-1"])


def test_engines_lost_and_describe_name_the_engines_and_the_error():
    e = EnginesLost({2: "its weight load did not answer within weight_sync.timeout_s=5s", 0: "ActorDiedError"})
    assert e.engines == [0, 2] and "rollout worker 2: its weight load" in str(e)
    assert describe(ValueError("first line\nsecond")) == "ValueError: first line"
    assert describe(KeyError()) == "KeyError" and len(describe(ValueError("x" * 500))) == 160


class FakeWorker:
    """A worker handle whose `generate.remote(groups)` returns a ref: the result, or a Lost error when dead."""

    def __init__(self, name, dead=False):
        self.name, self.dead, self.calls = name, dead, []
        self.generate = SimpleNamespace(remote=self._remote)

    def _remote(self, groups):
        self.calls.append([r.group_id for r in groups])
        if self.dead:
            return Lost(f"{self.name} died")
        trajs = [Trajectory(group_id=r.group_id, prompt_ids=[1], response_ids=[2, 3], logprobs=[-1.0, -1.0], text="",
                            finish_reason="stop", answer="", weight_version=4) for r in groups for _ in range(2)]
        metrics = {"rollout/tokens": 2 * len(trajs), "rollout/tokens_per_s": 1.0, "rollout/generate_s": 1.0,
                   "rollout/prefill_tokens_requested": 1, "rollout/prefill_tokens_computed": 1,
                   "rollout/prefix_cache_hits": 0}
        return trajs, metrics


def _wait(ref):
    if isinstance(ref, Exception):
        raise ref
    return ref


def _requests(n):
    return [PromptRequest(group_id=10 + i, prompt_ids=[1], answer="") for i in range(n)]


def test_a_lost_workers_groups_go_to_its_replacement_once():
    workers = [FakeWorker("w0"), FakeWorker("w1", dead=True), FakeWorker("w2")]
    fresh = FakeWorker("w1-new")
    asked = []

    def recover(k, error):
        asked.append((k, str(error)))
        return fresh if isinstance(error, Lost) else None

    source = SingleTurnSource(CFG, workers, _wait, recover)
    row: dict = {}
    trajs = source.collect(source.launch(_requests(5)), 4, row)
    assert asked == [(1, "w1 died")] and workers[1] is fresh  # the live list holds the replacement
    assert fresh.calls == [[11, 14]]  # exactly the failed call's groups, to the replacement
    assert sorted(t.group_id for t in trajs) == sorted([10, 11, 12, 13, 14] * 2)  # every group once, n samples each
    assert row["rollout/worker_restarts"] == 1 and row["rollout/groups_reissued"] == 2
    assert row["rollout/tokens"] == 20


def test_a_worker_lost_twice_is_replaced_twice_and_other_errors_are_raised():
    fresh = [FakeWorker("a", dead=True), FakeWorker("b")]
    source = SingleTurnSource(CFG, [FakeWorker("w0", dead=True)], _wait, lambda k, e: fresh.pop(0))
    row: dict = {}
    assert len(source.collect(source.launch(_requests(2)), 4, row)) == 4
    assert row["rollout/worker_restarts"] == 2 and row["rollout/groups_reissued"] == 4
    no_recovery = SingleTurnSource(CFG, [FakeWorker("w0", dead=True)], _wait, lambda k, e: None)
    with pytest.raises(Lost, match="w0 died"):
        no_recovery.collect(no_recovery.launch(_requests(1)), 4, {})
    without_hook = SingleTurnSource(CFG, [FakeWorker("w0", dead=True)], _wait)
    with pytest.raises(Lost):
        without_hook.fetch(without_hook.launch(_requests(1)))


class FakeSyncer:
    """Loses engines `lost[attempt]` on each sync attempt, then passes."""

    def __init__(self, lost):
        self.lost, self.attempts = list(lost), 0

    def sync_with_retries(self, version, retries):
        self.attempts += 1
        if self.lost:
            raise EnginesLost(self.lost.pop(0))
        return {"sync/version": version}


def test_the_job_replaces_engines_lost_in_a_sync_and_redoes_it():
    job = Job(CFG, "model", 0)
    job.syncer = FakeSyncer([{1: "hung"}, {0: "ActorDiedError", 1: "hung again"}])
    job.actors = SimpleNamespace(rollout=["e0", "e1"])
    replaced = []

    def replace(k, why, sync=True):
        job.restarts.spend(f"rollout worker {k}", why)
        replaced.append((k, why, sync))
        job.actors.rollout[k] = f"{job.actors.rollout[k]}+"  # a fresh handle

    job.replace_rollout = replace
    metrics = job.sync_weights(7)
    # the last first (under placement.elastic the last engine may leave the job, the others keep their indexes)
    assert replaced == [(1, "hung", False), (1, "hung again", False), (0, "ActorDiedError", False)]
    assert job.syncer.attempts == 3 and job.version == 7
    assert metrics == {"sync/version": 7, "sync/engine_restarts": 3, "faults/restarts_total": 3}
    job.syncer = FakeSyncer([{0: "x"}])
    with pytest.raises(RestartsExhausted, match="rollout worker 0 failed"):  # the 4th restart of max_restarts=3
        job.sync_weights(8)


def test_an_engine_replaced_inside_another_ones_re_formation_is_not_replaced_again():
    """A collective sync loses engines 0 and 1 (a node with both went): replacing 1 re-forms the group, which finds
    the old 0 dead and replaces it there (counted with the sync); the loop then leaves the fresh 0 alone."""
    job = Job(CFG, "model", 0)
    job.syncer = FakeSyncer([{0: "node lost", 1: "node lost"}])
    job.actors = SimpleNamespace(rollout=["e0", "e1"])
    replaced = []

    def replace(k, why, sync=True):
        replaced.append(k)
        job.actors.rollout[k] = f"{job.actors.rollout[k]}+"
        if k == 1:  # its re-formation finds the old engine 0 dead: replaced inside (`_connect_engine`)
            replaced.append(0)
            job.actors.rollout[0] = "e0+"
            job.reform_restarts += 1

    job.replace_rollout = replace
    metrics = job.sync_weights(3)
    assert replaced == [1, 0] and job.actors.rollout == ["e0+", "e1+"]
    assert metrics["sync/engine_restarts"] == 2


class Recorder:
    """A fake actor handle: `h.method.remote(*args)` records (name, method, args) in `log` and returns `answer`."""

    def __init__(self, name: str, log: list, answer=None):
        self.name, self.log, self.answer = name, log, answer

    def __getattr__(self, method):
        return SimpleNamespace(remote=lambda *args: self.log.append((self.name, method, args)) or self.answer)


def _membership_syncer(monkeypatch, concurrent: bool, engines: int = 2):
    """A WeightSyncer over fake handles (no Ray: its bounded get and the engines' gather return what the calls
    returned)."""
    import orchestrator.weight_sync.syncer as syncer_module

    monkeypatch.setattr(syncer_module, "gather_engines", lambda refs, *a, **k: dict(refs))
    log: list = []
    syncer = WeightSyncer(CFG, trainer=Recorder("trainer", log, {"group": "g1"}), strategy="object_store",
                          engines=[Recorder(f"e{k}", log) for k in range(engines)])
    syncer.strategy = SimpleNamespace(concurrent=concurrent, options=lambda ws: {})
    syncer._get = lambda refs, what: refs
    syncer.synced = []
    syncer.sync = lambda version, ids=None: syncer.synced.append((version, ids)) or {"sync/version": version}
    return syncer, log


def test_a_collective_strategy_reforms_its_group_for_a_fresh_engine_and_syncs_every_engine(monkeypatch):
    syncer, log = _membership_syncer(monkeypatch, concurrent=True)
    fresh = Recorder("e1-new", log)
    syncer.replace_engine(1, fresh, 7)
    # every engine alive (a dead one would hold the new group), then a new sender (a new group name on the trainer,
    # the old group destroyed), then the trainer and EVERY engine connect
    assert [(who, m) for who, m, _ in log[:2]] == [("e0", "ready"), ("e1-new", "ready")]
    log[:2] = []
    assert [(who, m, args[1]) for who, m, args in log] == [("trainer", "weight_sync", "setup"),
                                                          ("trainer", "weight_sync", "connect"),
                                                          ("e0", "weight_sync", "connect"),
                                                          ("e1-new", "weight_sync", "connect")]
    assert syncer.synced == [(7, None)] and syncer.reforms == 1  # the broadcast reaches the whole group
    # an engine joins and the last one leaves: the group is re-formed each time, with the members of the moment
    log.clear()
    syncer.add_engine(Recorder("e2", log), 7)
    assert [who for who, m, _ in log if m == "weight_sync"] == ["trainer", "trainer", "e0", "e1-new", "e2"]
    log.clear()
    syncer.remove_engine(2)
    assert [who for who, m, _ in log if m == "weight_sync"] == ["trainer", "trainer", "e0", "e1-new"]
    assert len(syncer.engines) == len(syncer.engine_versions) == 2 and syncer.reforms == 3
    # an engine leaves from the middle (its node drained): the last takes its index, the group re-formed so
    log.clear()
    syncer.remove_engine(0)
    assert [who for who, m, args in log if m == "weight_sync"] == ["trainer", "trainer", "e1-new"]
    assert [who for who, m, args in log if m == "weight_sync" and args[1] == "connect"][-1:] == ["e1-new"]
    assert [e.name for e in syncer.engines] == ["e1-new"] and syncer.engine_versions == [None]
    with pytest.raises(ValueError, match="never the only one"):
        syncer.remove_engine(0)


def test_a_per_engine_strategy_connects_only_the_fresh_engine_and_syncs_only_it(monkeypatch):
    syncer, log = _membership_syncer(monkeypatch, concurrent=False)
    syncer.replace_engine(1, Recorder("e1-new", log), 7)
    assert [(who, args[1]) for who, _, args in log] == [("e1-new", "connect")]
    assert syncer.synced == [(7, [1])] and syncer.reforms == 0
    log.clear()
    syncer.add_engine(Recorder("e2", log), None)  # before the first sync: it holds what the others hold
    assert [(who, args[1]) for who, _, args in log] == [("e2", "connect")] and syncer.synced == [(7, [1])]
    syncer.remove_engine(2)
    assert log[-1][0] == "e2" and len(syncer.engines) == 2  # nothing re-formed
    # from the middle: the last engine connects again at the index it takes (a delta receiver keys its payload by
    # it), its verified version forgotten (its next sync: the full weights, verified and probed)
    syncer.add_engine(Recorder("e2", log), None)
    syncer.engine_versions = [7, 7, 7]
    log.clear()
    syncer.remove_engine(0)
    assert [(who, args[1], args[-1]) for who, _, args in log] == [("e2", "connect", 0)]
    assert [e.name for e in syncer.engines] == ["e2", "e1-new"] and syncer.engine_versions == [None, 7]
    with pytest.raises(ValueError, match="one of 0..1 may leave"):
        syncer.remove_engine(2)


def test_a_second_batch_on_a_worker_already_replaced_goes_to_the_replacement_without_a_new_restart():
    """disaggregated_async: two batches in flight on one worker that dies; the first fetch replaces it."""
    workers = [FakeWorker("w0", dead=True)]
    replacements = [FakeWorker("w0-new")]
    source = SingleTurnSource(CFG, workers, _wait, lambda k, e: replacements.pop(0))
    first, second = source.launch(_requests(1)), source.launch(_requests(2))
    row1, row2 = {}, {}
    assert len(source.collect(first, 4, row1)) == 2 and len(source.collect(second, 4, row2)) == 4
    assert (row1["rollout/worker_restarts"], row1["rollout/groups_reissued"]) == (1, 1)
    assert (row2["rollout/worker_restarts"], row2["rollout/groups_reissued"]) == (0, 2)  # one restart in all
    assert workers[0].name == "w0-new" and workers[0].calls == [[10], [10, 11]]


class _Method:
    def __init__(self, calls: list, name: str, k: int):
        self.calls, self.name, self.k = calls, name, k

    def remote(self, *args):
        self.calls.append(("call", self.k, self.name, args))
        return f"ref-{self.k}"


class _Handle:
    """A stand-in for a rollout worker's actor handle: records `<method>.remote(*args)`."""

    def __init__(self, calls: list, k: int):
        self.calls, self.k = calls, k

    def __getattr__(self, name: str):
        return _Method(self.calls, name, self.k)


def test_call_engine_runs_the_fault_hooks_first_then_the_call_and_only_inside_the_block():
    calls: list = []
    workers = [_Handle(calls, 0), _Handle(calls, 1)]
    with fault_hook(lambda window, k, handle: calls.append(("hook", window, k, handle is workers[k]))):
        assert call_engine(workers, 1, "probe", "probe_logprobs", [1, 2], [3]) == "ref-1"
    assert calls == [("hook", "probe", 1, True), ("call", 1, "probe_logprobs", ([1, 2], [3]))]
    call_engine(workers, 0, "generate", "generate", ["r"])  # outside the block: no hook
    assert calls[-1] == ("call", 0, "generate", (["r"],)) and len(calls) == 3
    with pytest.raises(ValueError, match=r"unknown window 'probes'.*'probe'"):
        call_engine(workers, 0, "probes", "probe_logprobs")
    assert set(ENGINE_WINDOWS) >= {"load", "probe", "generate", "eval", "stream_drain", "stream_snapshot", "sleep",
                                   "wake", "connect", "stream_submit"}


def test_engines_lost_keeps_what_the_other_engines_answered():
    e = EnginesLost({1: "lost during its logprob probe: ActorDiedError"}, {0: [-1.0, -2.0]})
    assert e.engines == [1] and e.answered == {0: [-1.0, -2.0]} and "rollout worker 1: lost during" in str(e)
    assert EnginesLost({0: "x"}).answered == {}


def _elastic_job(monkeypatch, engines: int):
    """A Job over fake actors: engines k in groups 1..engines of their own (group 0: the job's), `ray.kill` and the
    group removal recorded."""
    import orchestrator.job as job_module
    from orchestrator.placement.plan import ActorSlot, GroupPlan, JobPlan

    killed, removed = [], []
    monkeypatch.setattr(job_module.ray, "kill", killed.append)
    monkeypatch.setattr(job_module, "remove_groups", lambda pgs: removed.extend(pgs))
    plan = JobPlan("disaggregated", [GroupPlan("rl-orch-job", [{"CPU": 1}], "PACK")]
                   + [GroupPlan(f"rl-orch-rollout-{k}", [{"CPU": 1}], "STRICT_PACK") for k in range(engines)],
                   {"trainer": [ActorSlot("trainer", 0, 0, {})],
                    "rollout": [ActorSlot("rollout", k + 1, 0, {}) for k in range(engines)]})
    job = Job(load_config("configs/grpo_arith_cpu.yaml", ["placement.elastic=true", "rollout.max_workers=3",
                                                          "trainer.total_steps=20"]), "model", 0)
    rollout = [f"e{k}" for k in range(engines)]
    job.actors = SimpleNamespace(rollout=rollout, all=["trainer", *rollout], plan=plan,
                                 pgs=["pg-job"] + [f"pg{k}" for k in range(engines)])
    return job, killed, removed


def test_an_engine_leaves_from_the_middle_and_one_found_lost_meanwhile_is_replaced_after(monkeypatch):
    """retire_rollout(why, 0) of three engines: the last takes index 0 (actors, slots and syncer alike), its group
    goes; the collective group's re-formation without it finds engine 1 dead: the actor lists and groups are still
    cleaned, then engine 1 is replaced (synced) and counted with the next sync."""
    job, killed, removed = _elastic_job(monkeypatch, 3)

    class Syncer:
        engines = ["e0", "e1", "e2"]

        def remove_engine(self, k):
            self.engines[k] = self.engines.pop()  # the last takes index k
            raise EnginesLost({1: "ActorDiedError"})

    job.syncer, replaced = Syncer(), []
    job.replace_rollout = lambda k, why, sync=True: replaced.append((k, why, sync))
    assert job.retire_rollout("its node is being drained", 0) == 0
    assert job.actors.rollout == ["e2", "e1"] and job.syncer.engines == ["e2", "e1"] and killed == ["e0"]
    assert [s.group for s in job.actors.plan.slots["rollout"]] == [3, 2] and removed == ["pg0"]
    assert job.actors.plan.groups[1].bundles == [] and "e0" not in job.actors.all  # a middle group: kept, empty
    assert replaced == [(1, "ActorDiedError", True)] and job.reform_restarts == 1
    with pytest.raises(ValueError, match="the only engine"):
        job.actors.rollout[1:] = []
        job.retire_rollout("why")
