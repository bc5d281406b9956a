"""placement.auto's re-placement on Ray (local, CPU) with the tiny random model: after step 2 the actors are
checkpointed, stopped (placement group removed), started again in a forced new split and restored.

One run, switched from one engine in one-step-off mode (rollout.mode=one_step_off) to two streaming engines (the
sizer's stream split: rollout.mode=stream, algo.max_staleness=k), checks that the trainer's weights and AdamW state
(step, exp_avg, exp_avg_sq, param groups) are exactly the same before and after, that both engines pass the
verified weight sync, that the run finishes with continuous step numbers, and that every step after the switch
trains from the streaming pipeline, drawing the pending batch's prompts again (dropped from the checkpoint, whose
loader is before them): none skipped, none trained twice. (Before, the move to two engines was a run of its own.)
A placement the cluster cannot hold falls back to the old one.
"""
from __future__ import annotations

import json

import pytest
import ray
import torch

import orchestrator.placement.replace as replace
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.rollout.stream_source import StreamRollouts
from orchestrator.sizing.workload import Split
from orchestrator.weight_sync import compare_checksums
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [
        REWARD, "placement.auto=true", "sizing.warmup_steps=2", *extra])


def _force(monkeypatch, overrides: dict, split: Split) -> dict:
    """decide() returns `overrides`; the controller's re-placement records the trainer's state just before and
    after."""
    def forced(rows, cfg, modes=None):
        assert [r["step"] for r in rows] == [1, 2]  # the warm-up rows: logged step 1 + this step's row
        return replace.Replacement(overrides, split, f"forced: {overrides}", 1.0, 2.0, 3), "forced"

    seen: dict = {}
    real = GRPOController._replace

    def spy(ctl, step, ovr, ckpt=None):
        seen["before"] = _state(ctl.actors.trainer)
        seen["fields"] = real(ctl, step, ovr, ckpt)
        seen["after"] = _state(ctl.actors.trainer)
        return seen["fields"]

    monkeypatch.setattr(replace, "decide", forced)
    monkeypatch.setattr(GRPOController, "_replace", spy)
    return seen


def _state(trainer) -> dict:
    named, _ = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
    return {"weights": dict(named), "optimizer": ray.get(trainer.optimizer_state.remote()),
            "step": ray.get(trainer.get_step.remote())}


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] == 2  # optimizer steps: one per GRPO step (mini_batches 1)
    assert a["weights"].keys() == b["weights"].keys() and a["weights"]
    for name, t in a["weights"].items():
        assert t.dtype == torch.float32 and torch.equal(t, b["weights"][name]), name
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for name, st in sa.items():
        assert st.keys() == sb[name].keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        assert float(st["step"]) == 2.0
        assert all(torch.equal(st[k], sb[name][k]) for k in st), name
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]  # lr (scheduler), betas, ...


def _assert_engines_hold_trainer_weights(controller) -> None:
    _, meta = ray.get(controller.actors.trainer.weights_for_sync.options(num_returns=2).remote("float32"))
    for i, worker in enumerate(controller.actors.rollout):
        engine = ray.get(worker.checksums.remote())
        assert engine["version"] == controller.cfg.trainer.total_steps
        compare_checksums(meta["groups"], engine["groups"], where=f"rollout worker {i}")


def test_a_placement_the_cluster_cannot_hold_falls_back_to_the_old_one(ray_local, tiny_model, tmp_path,
                                                                         monkeypatch):
    # 4 engines x 0.5 CPU + trainer 0.5 + reward 0.25 = 2.75 CPUs > the 2 of the test's Ray
    seen = _force(monkeypatch, {"rollout.num_workers": 4}, Split("disaggregated", 4, 1, 0))
    controller = GRPOController(_cfg(tiny_model, tmp_path, "trainer.total_steps=3", "placement.timeout_s=3"))
    try:
        result = controller.run()
        assert len(controller.actors.rollout) == 1 and controller.cfg.rollout.num_workers == 1
        _assert_engines_hold_trainer_weights(controller)
    finally:
        controller.shutdown()
    _assert_same_state(seen["before"], seen["after"])
    assert seen["fields"]["sizing/replaced"] == 0 and seen["fields"]["sizing/replace_failed"] == 1
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["sizing/replace_failed"] == 1
    assert not (tmp_path / "config_replaced_step_2.yaml").exists()


def test_a_one_step_off_run_switches_into_streaming_on_two_engines(ray_local, tiny_model, tmp_path, monkeypatch,
                                                                   capsys):
    # the overrides decide() would give for the sizer's stream split at k = 2 with two engines (replace.to_overrides)
    cfg = _cfg(tiny_model, tmp_path, "trainer.total_steps=4", "rollout.mode=one_step_off",
               "algo.max_staleness=2")
    split = Split("stream", 2, 1, 0)
    overrides, why = replace.to_overrides(cfg, split, k=2)
    assert why == "" and overrides["rollout.mode"] == "stream" and overrides["algo.max_staleness"] == 2
    assert overrides["rollout.num_workers"] == 2
    seen = _force(monkeypatch, overrides, split)
    drawn, trained = _record_groups(monkeypatch)
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        assert controller.cfg.rollout.mode == "stream" and isinstance(controller.pipeline, StreamRollouts)
        assert len(controller.actors.rollout) == 2 and controller.cfg.rollout.num_workers == 2
        _assert_engines_hold_trainer_weights(controller)  # both engines, after steps 3 and 4 on the new split
        # both engines streamed after the switch (streaming rows keep no per-engine keys: ask the engines)
        steps = ray.get([w.__ray_call__.remote(lambda a: a.stream.gen.steps if a.stream else 0)
                         for w in controller.actors.rollout])
        assert all(s > 0 for s in steps), steps
        assert ray.get(controller.actors.trainer.get_step.remote()) == 4
    finally:
        controller.shutdown()
    _assert_same_state(seen["before"], seen["after"])
    assert seen["fields"]["sizing/replaced"] == 1 and seen["fields"]["sizing/replace_s"] > 0
    assert (tmp_path / "config_replaced_step_2.yaml").is_file()
    assert json.loads((tmp_path / "ckpt" / "step_000002" / "state.json").read_text())["step"] == 2  # re-placement's
    pending = json.loads((tmp_path / "ckpt" / "step_000002" / "state.json").read_text())["async"]
    assert pending["mode"] == "one_step_off" and pending["batches"]  # batch 3, generated: dropped deliberately
    assert "was written by a one-step-off (asynchronous) run; this streaming" in capsys.readouterr().out
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["sync/version"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["sizing/replaced"] == 1 and rows[1]["sizing/rollout_gpus"] == 2
    assert rows[1]["sizing/predicted_step_s"] == 1.0
    assert all("rollout/worker0_tokens_per_s" in r and "rollout/worker1_tokens_per_s" not in r for r in rows[:2])
    assert [r["async/staleness"] for r in rows[:2]] == [0, 1]  # one step off before the switch
    assert not any("async/staleness_max" in r or "stream/running" in r for r in rows[:2])
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.n
    for r in rows[2:]:  # streaming after it: the buffer's staleness histogram and the engines' stream/* keys
        assert "stream/running" in r and "async/staleness" not in r and r["async/staleness_max"] <= 2
        assert sum(r[f"async/staleness_{s}"] for s in range(3)) == per_step
    # the one-step-off batch of step 3 pending at the checkpoint is drawn again by the streaming pipeline (the
    # checkpoint's loader is before it): the same groups and prompts, none skipped; no group trained twice
    before, after = drawn[:3], drawn[3:]
    assert [step for step, _ in before] == [1, 2, 3] and after[0] == before[2]
    groups = [g for step in trained for g in step]
    assert len(trained) == 4 and all(len(set(step)) == cfg.rollout.prompts_per_step for step in trained)
    assert len(groups) == len(set(groups)) and trained[:2] == [sorted(g for g, _ in d) for _, d in before[:2]]


def _record_groups(monkeypatch) -> tuple[list, list]:
    """Every draw of prompts (step, [(group id, prompt)]) and each trained batch's group ids, in order."""
    drawn, trained = [], []
    sample, train = GRPOController.sample_prompts, GRPOController.train

    def sample_spy(ctl, step, round_=0):
        requests = sample(ctl, step, round_)
        drawn.append((step, [(r.group_id, r.prompt) for r in requests]))
        return requests

    def train_spy(ctl, trajs, advantages, ref):
        trained.append(sorted({t.group_id for t in trajs}))
        return train(ctl, trajs, advantages, ref)

    monkeypatch.setattr(GRPOController, "sample_prompts", sample_spy)
    monkeypatch.setattr(GRPOController, "train", train_spy)
    return drawn, trained
