"""Lost rollout workers are survived (docs/faults.md): a worker whose process is killed during a step's
generation, or whose weight load hangs past weight_sync.timeout_s, is replaced in its bundle, synced to the
current weights, and its groups are issued again; the run finishes every step with the same samples per step.
Past run.max_restarts the run stops with an error naming the worker and what to do.
"""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
import ray

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.runtime.faults import RestartsExhausted, fault_hook
from tests.integration.conftest import assert_engine_holds_trainer_weights, tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml",
                       tiny_overrides(tiny_model, out, **{"trainer.total_steps": 3}) + [REWARD, *extra])


class KillInWindows(GRPOController):
    """Kills rollout worker 0's process (SIGKILL) right before its call in each (step, fault window) of `schedule`
    (orchestrator/runtime/faults.py `fault_hook`: at the call site, not after a sleep); records the groups and samples
    every step trained on."""

    schedule = ((2, "generate"), (3, "probe"), (3, "eval"))  # eval: after step 3's training and sync

    def __init__(self, cfg):
        super().__init__(cfg)
        self.at, self.killed, self.samples = 0, {}, {}

    def step(self, step: int):
        self.at = step
        return super().step(step)

    def train(self, trajs, advantages, ref):
        self.samples[self.at] = Counter(t.group_id for t in trajs)
        self.prompts = getattr(self, "prompts", set()) | {t.prompt for t in trajs}
        return super().train(trajs, advantages, ref)

    def kill(self, window: str, k: int, handle) -> None:
        if k == 0 and (self.at, window) in self.schedule and (self.at, window) not in self.killed:
            self.killed[self.at, window] = ray.get(handle.pid.remote())
            os.kill(self.killed[self.at, window], signal.SIGKILL)


# One run serves every fault window of a synchronous step (docs/faults.md): rollout worker 0's first weight load
# hangs past weight_sync.timeout_s (replaced at sync 1, then synced); at step 2 its replacement is killed as its
# generate call is made (replaced again, its groups reissued); at step 3 the next one is killed as the logprob probe
# reaches it (a lost engine, not a failed sync: replaced and the sync redone), and the next as the eval reaches it.
# Then, its run.max_restarts spent, one more lost worker stops the run naming it (before: a run of its own).
# The eval's prompts are held out of the training data (eval.holdout): no prompt a step trained on is one of them
# (before: a run of its own in test_eval_run.py).
def test_a_worker_lost_in_every_window_of_a_step_is_replaced_and_nothing_is_lost(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "weight_sync.timeout_s=4", "run.max_restarts=4",  # a sync takes 0.1-0.3 s
               "eval.every_steps=3", "eval.data=", "eval.holdout=0.5", "data.arith_size=40", "eval.num_prompts=2",
               "eval.n=2", "eval.temperature=1.0", "eval.max_new_tokens=4")
    controller = KillInWindows(cfg)
    try:
        controller.job.start()
        controller.job.wait(controller.job.actors.rollout[0].extension_call.remote("inject_hang_next_load", 600))
        controller.job.start = lambda resume_from=None: None  # run() on the job started above
        with fault_hook(controller.kill):
            result = controller.run()
        new_pid = ray.get(controller.job.actors.rollout[0].pid.remote())
        # the replacements took the current weights before they sampled, and every later sync verified them
        assert_engine_holds_trainer_weights(controller, 3)
        # past run.max_restarts (its 4 are spent): the next lost worker stops the run, naming it and what to do
        os.kill(new_pid, signal.SIGKILL)
        with pytest.raises(RestartsExhausted, match=r"rollout worker 0 failed .*run.max_restarts=4.*checkpoint.resume"):
            controller.evaluator.evaluate(controller)  # an eval pass: the run's own calls and recover hook
    finally:
        controller.shutdown()
    assert sorted(controller.killed) == sorted(KillInWindows.schedule) and new_pid not in controller.killed.values()
    rows = [json.loads(line) for line in open(result.metrics)]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the eval of the starting weights
    assert [r["sync/engine_restarts"] for r in steps] == [1, 0, 1]  # the hung load (sync 1), the probe (sync 3)
    assert [r["sync/version"] for r in steps] == [1, 2, 3]
    assert [r["rollout/worker_restarts"] for r in steps] == [0, 1, 0]  # the kill as step 2's generate call was made
    assert [r["rollout/groups_reissued"] for r in steps] == [0, 2, 0]  # prompts_per_step groups, all on worker 0
    assert rows[-1]["eval/worker_restarts"] == 1 and rows[-1]["eval/weight_version"] == 3
    assert rows[-1]["eval/prompts"] == rows[0]["eval/prompts"] == 2 and rows[-1]["eval/samples"] == 4  # whole
    assert [r["faults/restarts_total"] for r in steps] == [1, 2, 3] and controller.job.restarts.used == 4  # + eval's
    # every step trained on its own 2 groups of n = 4 samples: nothing lost, nothing counted twice
    for step, groups in controller.samples.items():
        assert sorted(groups) == [2 * step, 2 * step + 1]
        assert set(groups.values()) == {4}
    # eval.holdout: every held-out prompt (not only the 2 evaluated) is disjoint from every trained one
    training = set(controller.evaluator.train_items)
    held_all = {ex.prompt for i, ex in enumerate(controller.examples) if i not in training}
    evaluated = {r.prompt for r in controller.evaluator.requests}
    assert 1 <= len(evaluated) <= 2 and evaluated <= held_all and len(held_all) >= 10
    assert len(controller.prompts) >= 5 and "" not in controller.prompts and not held_all & controller.prompts


class KillBeforeAsyncStep(GRPOController):
    """rollout.mode=one_step_off: kills rollout worker 0 at the start of step 2, before the batch of
    step 3 is launched on it (the batch of step 2 was generated during step 1)."""

    def step(self, step):
        if step == 2:
            os.kill(ray.get(self.job.actors.rollout[0].pid.remote()), signal.SIGKILL)
        return super().step(step)


def _run_to_step_3(controller) -> list[dict]:
    """Run the controller (3 steps), check the engine holds the trainer's step-3 weights, shut down; its rows."""
    try:
        result = controller.run()
        assert_engine_holds_trainer_weights(controller, 3)
    finally:
        controller.shutdown()
    return [json.loads(line) for line in open(result.metrics)]


def test_async_mode_reissues_the_in_flight_batch_of_a_killed_worker(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "rollout.mode=one_step_off")
    rows = _run_to_step_3(KillBeforeAsyncStep(cfg))
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the batch of step 3 (launched during step 2, on weights 1) was issued again to the replacement
    assert [r["rollout/worker_restarts"] for r in rows] == [0, 0, 1]
    assert [r["rollout/groups_reissued"] for r in rows] == [0, 0, 2]
    assert [r["async/weight_version"] for r in rows] == [0, 0, 1]
    assert rows[-1]["faults/restarts_total"] == 1


def test_streaming_mode_reissues_the_groups_of_a_killed_worker(ray_local, tiny_model, tmp_path):
    """rollout.mode=stream: the killed worker's groups in flight (those of step 3, launched at the start of
    step 2) start again on its replacement; every step trains whole groups, none twice."""
    class Recorded(KillBeforeAsyncStep):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.trained: list = []

        def train(self, trajs, advantages, ref):
            self.trained.append(Counter(t.group_id for t in trajs))
            return super().train(trajs, advantages, ref)

    cfg = _cfg(tiny_model, tmp_path, "rollout.mode=stream")
    controller = Recorded(cfg)
    rows = _run_to_step_3(controller)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sum(r["rollout/worker_restarts"] for r in rows) == 1 and rows[-1]["faults/restarts_total"] == 1
    assert sum(r["rollout/groups_reissued"] for r in rows) >= 1
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    groups = [g for step in controller.trained for g in step]
    assert len(controller.trained) == 3 and len(groups) == len(set(groups)) == 6  # 2 groups a step, none twice
    assert all(set(step.values()) == {4} for step in controller.trained)  # whole groups of n = 4
