"""rollout.mode=one_step_off on Ray (local, CPU) with a tiny random model and vLLM on CPU.

Three one-step-off steps with DAPO dynamic sampling (a reward that makes the groups of even answers uniform, so
steps take extra rounds, generated at once on the engines' weights): every batch's staleness within
algo.max_staleness (0 on step 1, then 1), only informative groups trained while there are enough, the verified weight
sync passes every step, engines and trainer agree at the end, a wrong weight version is still caught, and a resume
trains the batch generated before the checkpoint (kept in it) with the loader where the uninterrupted run left it.
The same run checks the trackers (before: a run of its own): the demo config's `metrics.trackers: [tensorboard]` writes
every row metric as TensorBoard scalars (read back with TensorBoard's own event reader) and the completion samples as
text and samples.jsonl, and the resume from the older checkpoint redoes step 3 without any step showing twice.
Multi-turn rollouts (the guessing environment) run in the same pipeline: the async pipeline wraps any rollout source.
"""
from __future__ import annotations

import json
import shutil

import pytest
import ray

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.rollout import PromptRequest
from orchestrator.weight_sync import WeightMismatchError
from tests.integration.conftest import assert_engine_holds_trainer_weights, tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.dapo_rewards:parity_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [
        REWARD, "rollout.mode=one_step_off", "trainer.total_steps=3", "checkpoint.every_steps=1",
        "metrics.samples_every=1", "metrics.samples_n=2",
        "algo.dynamic_sampling.enabled=true", "algo.dynamic_sampling.max_rounds=3", *extra])


# One 3-step run serves the staleness, version and checkpoint checks, then its resume from step 2's checkpoint.
def test_async_staleness_within_its_bound_and_a_resume_trains_the_pending_batch(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "checkpoint.keep_last=3")
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        final_loader = controller.loader.state_dict()
        # engines and trainer agree at the end: version 3 and equal checksums; 3 optimizer steps
        trainer, worker = assert_engine_holds_trainer_weights(controller, 3)
        assert ray.get(trainer.get_step.remote()) == 3
        # the version check still catches a batch of a version other than the expected one
        req = PromptRequest(group_id=0, prompt_ids=[1, 2, 3, 4, 5], answer="")
        launched = controller.source.launch([req])
        assert controller.source.collect(launched, 3, {})[0].weight_version == 3
        with pytest.raises(WeightMismatchError, match="version 3, expected 2"):
            controller.source.collect(launched, 2, {})
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert [r["async/weight_version"] for r in rows] == [0, 0, 1]
    assert [r["rollout/queue_depth"] for r in rows] == [1, 1, 0]  # the next batch in flight, none past the end
    assert all(r["async/staleness"] <= cfg.algo.max_staleness for r in rows)
    assert rows[-1]["async/max_staleness_seen"] == 1 and rows[-1]["async/dropped_batches"] == 0
    assert [r["sync/version"] for r in rows] == [1, 2, 3]  # the verified sync ran (and passed) every step
    # steps 1 and 2 ran the next batch's generation; step 3 launched nothing past trainer.total_steps
    assert all(r["async/overlap_s"] >= 0 for r in rows) and rows[-1]["async/overlap_s"] == 0
    assert all(r["actor/tis_weight_mean"] > 0 for r in rows)
    per_step = cfg.rollout.prompts_per_step
    for r in rows:  # dynamic sampling: rounds of prompts_per_step groups, the batch keeps its size
        assert r["rollout/dyn_groups_generated"] == per_step * r["rollout/dyn_rounds"]
        assert r["rollout/dyn_groups_kept"] + r["rollout/dyn_groups_padded"] == per_step
        if r["rollout/dyn_groups_padded"] == 0:  # enough informative groups: no uniform group trained
            assert r["rollout/groups_mixed_frac"] == 1.0
    assert any(r["rollout/dyn_rounds"] > 1 for r in rows), [r["rollout/dyn_rounds"] for r in rows]
    # a checkpoint stores the loader before the pending batch's prompts: those of the batches before it and of the
    # rounds of the steps before (a step's rounds are drawn after the next batch was launched); the last, every prompt
    extra = [per_step * (r["rollout/dyn_rounds"] - 1) for r in rows]
    positions = [_drawn(json.loads((tmp_path / "ckpt" / f"step_{s:06d}" / "state.json").read_text())["loader"])
                 for s in (2, 3)]
    assert positions == [2 * per_step + extra[0], 3 * per_step + sum(extra)]
    resumed = _check_resume_trains_the_batch_generated_before_the_checkpoint(tiny_model, tmp_path, final_loader)
    _check_trackers(tmp_path, rows, resumed)


def _drawn(loader_state: dict) -> int:
    """Prompts drawn so far by a loader of this state."""
    return loader_state["epoch"] * loader_state["size"] + loader_state["position"]


def _check_resume_trains_the_batch_generated_before_the_checkpoint(tiny_model, tmp_path, final_loader) -> None:
    shutil.rmtree(tmp_path / "ckpt" / "step_000003")  # as if the run stopped after step 2 (batch 3 generated)
    assert "async" in json.loads((tmp_path / "ckpt" / "step_000002" / "state.json").read_text())
    second = GRPOController(_cfg(tiny_model, tmp_path, "checkpoint.resume=latest"))
    try:
        result = second.run()
        assert ray.get(second.actors.trainer.get_step.remote()) == 3
    finally:
        second.shutdown()
    assert second.start_step == 2
    row = result.rows[-1]
    # the checkpoint kept batch 3 as generated by weights 1: trained as in the uninterrupted run (exact resume)
    assert row["step"] == 3 and row["async/staleness"] == 1 and row["async/weight_version"] == 1
    assert second.loader.state_dict() == final_loader
    return result.rows


def _check_trackers(tmp_path, first_rows: list[dict], resumed_rows: list[dict]) -> None:
    """TensorBoard scalars and completion samples of the run and its resume (see the module docstring)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    assert [r["step"] for r in resumed_rows] == [1, 2, 3]
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})  # the reader TensorBoard serves
    acc.Reload()
    for name in ("reward/mean", "timing/generate_s", "actor/loss"):
        assert [e.step for e in acc.Tensors(name)] == [1, 2, 3], name  # no step twice after the resume
    last = float(tensor_util.make_ndarray(acc.Tensors("reward/mean")[-1].tensor_proto))
    assert last == pytest.approx(resumed_rows[-1]["reward/mean"], abs=1e-6)
    numeric = {k for r in first_rows for k, v in r.items() if isinstance(v, (int, float)) and k != "step"}
    assert numeric <= set(acc.Tags()["tensors"])  # every numeric JSONL metric is a TensorBoard scalar
    assert [t.step for t in acc.Tensors("samples/text_summary")] == [1, 2, 3]
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 1, 2, 2, 3, 3]
    r = records[-1]
    assert r["completion"] and r["prompt"] and [k.split(":")[-1] for k in r["rewards"]] == ["parity_reward"]
    assert r["finish_reason"] in ("stop", "length") and r["response_len"] > 0 and isinstance(r["advantage"], float)
    # one step off: step 3's batch was generated by weights 1, a dynamic-sampling round of it by the engines' 2
    assert {x["weight_version"] for x in records if x["step"] == 3} <= {1, 2}


def test_async_multi_turn_guessing_game(ray_local, tiny_model, tmp_path):
    """rollout.mode=one_step_off with env.name=guessing: episodes of the next step play while the
    trainer trains; staleness within its bound, the verified sync every step, sticky groups, env rewards."""
    cfg = load_config("configs/grpo_guessing_cpu.yaml", tiny_overrides(tiny_model, tmp_path) + [
        "rollout.mode=one_step_off", "algo.tis_cap=2.0", "trainer.total_steps=3", "rollout.num_workers=2",
        "rollout.max_new_tokens=8", "env.max_turns=3", "env.max_tokens=320", "checkpoint.every_steps=0"])
    controller = GRPOController(cfg)
    try:
        result = controller.run()
        trainer, _ = assert_engine_holds_trainer_weights(controller, 3)
        assert ray.get(trainer.get_step.remote()) == 3
        placed = controller.source.router.loads()
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1]
    assert [r["sync/version"] for r in rows] == [1, 2, 3]
    assert all(1.0 <= r["rollout/turns_mean"] <= 3.0 for r in rows)  # multi-turn episodes, env metrics logged
    assert all("env/step_s" in r and "reward/mean" in r and r["router/groups_per_worker_max"] >= 1 for r in rows)
    assert all(r["actor/tis_weight_mean"] > 0 for r in rows)
    assert rows[0]["async/overlap_s"] >= 0 and rows[-1]["async/overlap_s"] == 0
    assert sum(placed.values()) == 0  # every routed group was released once its episodes returned
