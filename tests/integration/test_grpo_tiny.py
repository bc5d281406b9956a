"""Two GRPO steps on Ray (local, CPU) with a tiny random model and vLLM on CPU.

Checks that the weights change, that every engine holds exactly the trainer's weights after the sync
(checksums and logprobs), that a corrupted transfer is caught, that metrics and checkpoint exist and
load, that the reference, KL and IcePop's mismatch metrics are reported, that the gloo broadcast syncs a run, that the
run's own command run again (`checkpoint.resume: auto`, the default) skips a torn newest checkpoint with a warning
naming the file, loads the previous one (after verifying every file against its manifest), says so in one line and
continues (one run, checkpointing by time, and its resume serve all of these; before: test_checkpoint_resume.py ran
its own), and that short resources and a hung phase fail clearly.
"""
from __future__ import annotations

import json

import pytest
import ray
import torch
from safetensors.torch import load_file

from orchestrator.checkpoint import CheckpointWarning, read_manifest, verify_manifest
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.placement.groups import PlacementError
from orchestrator.rollout import PromptRequest
from orchestrator.weight_sync import WeightMismatchError, compare_checksums
from tests.integration.conftest import assert_engine_holds_trainer_weights, tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [REWARD, *extra])


def _check_engine_samples_from_the_trainer(controller) -> None:
    """The first engine's checksums equal the trainer's after the last sync, and its logprobs match the trainer's
    (C03): it samples from the trainer's policy."""
    trainer, worker = assert_engine_holds_trainer_weights(controller, 2)
    req = PromptRequest(group_id=0, prompt_ids=[1, 2, 3, 4, 5], answer="")
    trajs, _ = ray.get(worker.generate.remote([req]))
    ours = ray.get(trainer.logprobs.remote([t.prompt_ids for t in trajs], [t.response_ids for t in trajs]))
    for t, lp in zip(trajs, ours):
        assert max(abs(a - b) for a, b in zip(t.logprobs, lp)) < 2e-3


def _check_a_corrupted_transfer_is_caught(controller) -> None:
    trainer, worker = controller.actors.trainer, controller.actors.rollout[0]
    named, meta = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
    bad = [(n, t.clone()) for n, t in named]
    victim = next(i for i, (n, _) in enumerate(bad) if "mlp.down_proj" in n)
    bad[victim][1].view(-1)[0] += 0.5
    report = ray.get(worker.weight_sync.remote("object_store", "load", bad, 7))
    with pytest.raises(WeightMismatchError, match="mlp"):
        compare_checksums(meta["groups"], report["groups"], where="rollout worker 0")


def _check_rows(controller, rows) -> None:
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "timing/generate_s", "timing/train_s", "timing/weight_sync_s", "sync/bytes",
                "actor/grad_norm", "rollout/response_len_mean"):
        assert all(key in r for r in rows), key
    assert rows[-1]["sync/version"] == 2
    # weight_sync.strategy=nccl (gloo on CPU): the broadcast is bucketed (4 MiB buckets)
    assert rows[-1]["sync/buckets"] >= 2 and rows[-1]["sync/seconds"] > 0
    for r in rows:  # vLLM's own prefix-cache counters: every prompt token of every sample is looked up
        n_prompt = 2 * 4 * len(controller.prompt_ids[0])  # prompts_per_step x n x tokens (equal-length prompts)
        assert abs(r["rollout/prefill_tokens_requested"] - n_prompt) <= 2 * 4 * 2
        assert 0 <= r["rollout/prefill_tokens_computed"] <= r["rollout/prefill_tokens_requested"]
        hit = 1 - r["rollout/prefill_tokens_computed"] / r["rollout/prefill_tokens_requested"]
        assert r["rollout/prefix_cache_hit_rate"] == pytest.approx(hit)
        assert r["rollout/worker0_tokens_per_s"] > 0
        # the reference and the KL term (algo.kl_coef > 0)
        assert r["timing/reference_s"] > 0 and "actor/kl" in r
        # algo.rollout_correction (orchestrator/algo/mismatch.py) through the whole path: config, controller,
        # trainer actor, loss; the fp32 CPU engine and the fp32 trainer differ by float noise only, so IcePop's
        # [0.5, 2] band keeps every token and the mismatch KL is tiny but measured every step
        assert 0 <= r["rollout/mismatch_kl_k3"] < 1e-4 and abs(r["rollout/mismatch_kl_k1"]) < 1e-3
        assert 0.5 < r["rollout/mismatch_ratio_min"] <= r["rollout/mismatch_ratio_max"] < 2.0
        assert r["rollout/mismatch_masked_token_frac"] == 0.0 and r["rollout/mismatch_masked_seq_frac"] == 0.0
        assert r["actor/tis_weight_mean"] == pytest.approx(1.0, abs=1e-2)
        assert r["actor/grad_norm"] > 0


def _check_checkpoint(result, tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(f"{result.checkpoint}/policy", dtype=torch.float32).state_dict()
    initial = load_file(str(tiny_model / "model.safetensors"))
    changed = [k for k, v in initial.items() if not torch.equal(v, trained[k])]
    assert len(changed) > len(initial) // 2, "the policy barely changed"
    state = json.loads(open(f"{result.checkpoint}/state.json").read())
    assert state["step"] == 2 and state["loader"]["position"] > 0


# One 2-step run on two engines (KL with a reference, IcePop token masking, the gloo broadcast, a checkpoint after
# every step by time: checkpoint.every_minutes=1e-4 (6 ms) with every_steps 0, truncated sampling: top-k 50 then top-p
# 0.9) serves the checks of the run (rows, sync, logprobs, checkpoint, a corrupted transfer caught); then its step-2
# checkpoint is torn and the same command resumes from step 1's: a second controller continues it to step 3.
# (Before: five runs, one per check.) Under truncation the trainer and the reference replay the sampler's kept set, so
# the mismatch checks of `_check_rows` (IcePop's band keeps every token, TIS weights ~1) and the 2e-3 logprob check
# hold as without it; with the full softmax the ratios would be the kept mass (benchmarks/truncated_sampling.py).
RUN = ("checkpoint.every_steps=0", "checkpoint.every_minutes=1e-4", "checkpoint.keep_last=3", "rollout.num_workers=2", "algo.kl_coef=0.05", "algo.kl_estimator=k3",
       "algo.rollout_correction.mode=token_mask", "weight_sync.strategy=nccl", "weight_sync.bucket_mb=4",
       "rollout.top_k=50", "rollout.top_p=0.9")


def test_two_steps_sync_exactly_checkpoint_catch_corruption_and_resume_past_a_torn_checkpoint(
        ray_local, tiny_model, tmp_path, capsys):
    first = GRPOController(_cfg(tiny_model, tmp_path, *RUN))
    try:
        result = first.run()
        assert first.actors.reference is not None
        _check_engine_samples_from_the_trainer(first)
        _check_rows(first, [json.loads(line) for line in open(result.metrics)])
        _check_a_corrupted_transfer_is_caught(first)  # last: it leaves engine 0 holding corrupted weights
        saved_loader = first.loader.state_dict()
    finally:
        first.shutdown()
    _check_checkpoint(result, tiny_model)
    one, two = _tear_the_newest_checkpoint(tmp_path)

    with pytest.warns(CheckpointWarning, match=f"skipping {two}: {two / 'policy' / 'model.safetensors'}: truncated"):
        second = GRPOController(_cfg(tiny_model, tmp_path, *RUN, "trainer.total_steps=3"))  # the same command, auto
    assert second.resume_from == one
    try:
        resumed = second.run()
        assert ray.get(second.actors.trainer.get_step.remote()) == 3
    finally:
        second.shutdown()
    assert f"resume: loaded checkpoint {one} (after step 1); continuing at step 2 of 3" in capsys.readouterr().out
    assert second.start_step == 1 and [r["step"] for r in resumed.rows] == [1, 2, 3]
    assert resumed.checkpoint.endswith("step_000003")
    # the redone step 2 checkpointed again (by time) in place of the torn one: every checkpoint verifies now
    assert [verify_manifest(tmp_path / "ckpt" / f"step_{s:06d}") for s in (1, 2, 3)] == [[], [], []]
    assert read_manifest(two)["step"] == 2
    # the loader where the uninterrupted run would be: step 3's prompts follow step 2's (2 per step)
    assert saved_loader["position"] + 2 == second.loader.state_dict()["position"] or second.loader.epoch > 0


def _tear_the_newest_checkpoint(tmp_path):
    """Steps 1 and 2 checkpointed (by time) and verified; step 2's weights lose their tail, as after a crash or a full
    disk past the rename. Returns (step 1's folder, step 2's)."""
    one, two = tmp_path / "ckpt" / "step_000001", tmp_path / "ckpt" / "step_000002"
    assert verify_manifest(one) == [] and verify_manifest(two) == [] and read_manifest(two)["step"] == 2
    assert "policy/tokenizer_config.json" in read_manifest(two)["files"]  # the tokenizer files are covered too
    torn = two / "policy" / "model.safetensors"
    with open(torn, "r+b") as f:
        f.truncate(torn.stat().st_size // 2)
    return one, two


def test_missing_resources_fail_placement_naming_them(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "placement.resource=fake_gpu", "placement.timeout_s=3")
    controller = GRPOController(cfg)
    with pytest.raises(PlacementError, match="fake_gpu"):
        controller.run()
    controller.shutdown()


def test_a_hung_phase_stops_the_run_with_a_timeout_error(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "run.phase_timeout_s=0.01")
    controller = GRPOController(cfg)
    try:
        with pytest.raises(TimeoutError, match="run.phase_timeout_s=0.01"):
            controller.run()
    finally:
        controller.shutdown()
