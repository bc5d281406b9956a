"""The logprob probe after each weight sync, with its negative control, on two vLLM CPU engines (tiny model).

Positive: every verified sync also probes, within weight_sync.probe_tolerance. Negative control: an engine
whose RESIDENT weights change after a verified load (one layer's kernel scaled through the worker extension,
never through the stream) still passes the checksums (vLLM's CPU GEMM packed that weight away; the
checksums are of what was loaded), but fails the probe, which names the engine; the rollout logprobs of
such an engine also leave the 2e-3 band the GRPO integration tests check. A fault right after a load fails
that sync; `sync_with_retries` redoes it (the reload rebuilds the kernel) and counts the failure.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch

from actors.rollout.worker import RolloutWorkerActor
from actors.trainer.trainer import TrainerActor
from orchestrator.algo import TrainBatch
from orchestrator.config import load_config
from orchestrator.rollout.types import PromptRequest
from orchestrator.weight_sync import compare_checksums
from orchestrator.weight_sync.probe import (DEFAULT_KL_TOLERANCE, DEFAULT_TOLERANCE, PolicyDivergedError,
                                            ProbeMismatchError)
from orchestrator.weight_sync.syncer import make_syncer
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
TOL = DEFAULT_TOLERANCE["float32"]


def _start(tiny_model: Path, out: Path):
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [
        "rollout.num_workers=2", "weight_sync.timeout_s=120", "weight_sync.strategy=object_store"])
    trainer = TrainerActor.options(num_cpus=0.5).remote(str(tiny_model), cfg.trainer, cfg.algo, 1.0, 12, 0)
    engines = [RolloutWorkerActor.options(num_cpus=0.5).remote(str(tiny_model), cfg.rollout, k) for k in range(2)]
    ray.get([a.ready.remote() for a in [trainer, *engines]])
    return cfg, trainer, engines


def _train_once(trainer, seed: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 500, (6,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(5, 500, (5,), generator=g).tolist() for _ in range(4)]
    batch = TrainBatch.with_sequence_advantages(prompts, responses, [[-1.0] * 5] * 4, [1.0, -1.0, 0.5, -0.5])
    return ray.get(trainer.train_step.remote(batch))


def _rollout_gap(trainer, engine) -> float:
    """Largest |rollout logprob - trainer logprob| over one group of 4 samples (the GRPO tests' 2e-3 check)."""
    trajs, _ = ray.get(engine.generate.remote([PromptRequest(group_id=0, prompt_ids=[1, 17872, 42, 8581, 553], answer="")]))
    ours = ray.get(trainer.logprobs.remote([t.prompt_ids for t in trajs], [t.response_ids for t in trajs]))
    return max(abs(a - b) for t, lp in zip(trajs, ours) for a, b in zip(t.logprobs, lp))


def test_probe_catches_resident_weights_that_the_checksums_miss(ray_local, tiny_model, tmp_path, capsys):
    cfg, trainer, engines = _start(tiny_model, tmp_path)
    started: list = []  # actors a check starts (killed with these)
    try:
        syncer = make_syncer(cfg, trainer, engines)
        diffs = []
        for version in (1, 2, 3):  # positive: every verified sync probes, within the tolerance
            if version > 1:  # lr 1e-3: lr / RMS(theta) ~ 0.05, under guards.update_ratio_max (0.5)
                assert 0 < _train_once(trainer, version)["actor/update_ratio"] < 0.5
            m = syncer.sync(version)
            assert m["sync/probe_s"] > 0 and m["sync/probe_max_abs_diff"] <= TOL
            assert 0 <= m["sync/probe_full_kl"] <= DEFAULT_KL_TOLERANCE["float32"]
            diffs.append((m["sync/probe_max_abs_diff"], m["sync/probe_full_kl"]))
        print(f"tiny model fp32: probe (max |diff|, full KL) per sync {diffs}, {m['sync/probe_s']:.3f} s")
        assert _rollout_gap(trainer, engines[1]) < 2e-3

        # negative control: engine 1's resident kernel changes after the verified load, not through the stream
        info = ray.get(engines[1].extension_call.remote("corrupt_resident_weights", 1.5))
        assert info == {"layer": "model.layers.0.mlp.down_proj", "packed": True}  # CPU GEMM packed the weight
        _, meta = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        report = ray.get(engines[1].checksums.remote())
        compare_checksums(meta["groups"], report["groups"], where="rollout worker 1")  # the checksums still pass
        assert report["version"] == 3
        with pytest.raises(ProbeMismatchError, match=r"rollout worker 1: probe logprobs differ from the trainer's by "
                                                     r"up to .* above weight_sync.probe_tolerance=0\.001") as err:
            syncer.probe()
        print(f"negative control: {err.value}")
        assert _rollout_gap(trainer, engines[1]) > 2e-3  # the GRPO tests' check would catch it too
        assert syncer.engine_versions == [3, None]  # the failed engine's next sync is a full one

        # a fault right after a load (stream and checksums right): that sync fails naming the engine ...
        ray.get(engines[0].extension_call.remote("inject_fault_after_next_load", 1.5))
        with pytest.raises(ProbeMismatchError, match="rollout worker 0: probe logprobs differ"):
            syncer.sync(4)
        # ... and a redo (weight_sync.retries) reloads, rebuilding the kernel: passes, counted
        ray.get(engines[1].extension_call.remote("inject_fault_after_next_load", 1.5))
        m = syncer.sync_with_retries(4, retries=1)
        assert m["sync/failures"] == 1 and m["sync/probe_max_abs_diff"] <= TOL
        assert _rollout_gap(trainer, engines[1]) < 2e-3
        _check_a_wrong_logit_outside_the_sampled_tokens(trainer, engines, syncer)
        _check_an_lr_typo_is_named_as_divergence(tiny_model, tmp_path, engines, capsys, started)
    finally:
        for a in (trainer, *engines, *started):
            ray.kill(a)


def _check_an_lr_typo_is_named_as_divergence(tiny_model: Path, out: Path, engines, capsys, started: list) -> None:
    """The other cause's negative control (issue 37): trainer.lr=0.5 (a typo for 5e-7) diverges the policy at its
    first update; with a probe tolerance no arithmetic meets (1e-12) the probe fails as a sync fault would, and the
    sync raises PolicyDivergedError naming the divergence and the version, said once as a warning first, not
    ProbeMismatchError. The diverged trainer joins `started` (killed by the caller)."""
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out / "lr") + [
        "trainer.lr=0.5", "trainer.warmup_steps=0", "weight_sync.probe_tolerance=1e-12",
        "weight_sync.strategy=object_store"])
    trainer = TrainerActor.options(num_cpus=0.5).remote(str(tiny_model), cfg.trainer, cfg.algo, 1.0, 12, 0)
    started.append(trainer)
    syncer = make_syncer(cfg, trainer, engines)  # its setup scores the probe on the starting weights
    # the trainer names it at the update: AdamW's first step moves every weight by lr (guards.update_ratio_max 0.5)
    assert _train_once(trainer, 5)["actor/update_ratio"] > 1.0
    capsys.readouterr()
    with pytest.raises(PolicyDivergedError) as e:
        syncer.sync(5)
    msg = str(e.value)
    assert msg.startswith("the policy diverged by weight version 5: the trainer's own logprobs of the fixed probe text "
                          "average") and "The weight sync is not at fault" in msg and "trainer.lr" in msg
    said = [line for line in capsys.readouterr().out.splitlines() if "the policy diverged" in line]
    assert said == [said[0]] and said[0].startswith("WARNING: the policy diverged by weight version 5")  # once


def _check_a_wrong_logit_outside_the_sampled_tokens(trainer, engines, syncer) -> None:
    """The full-distribution check's negative control: engine 0's logits of tokens outside the probe text trade places
    (the trainer's 8 likeliest such tokens at the first continuation position with its 8 least likely), which leaves
    every probe token's logprob bit-equal (the normaliser is unchanged): the logprob probe passes, the KL of the
    next-token distributions does not. Swapped back (a swap twice is none), the probe passes again."""
    prompt, cont = syncer.probe_ids
    rows = ray.get(trainer.probe_logprobs.remote(prompt, cont, True)).rows[0].clone()
    rows[list(set(prompt) | set(cont))] = float("nan")  # not a probe token
    a, b = rows.nan_to_num(-1e9).topk(8).indices.tolist(), (-rows.nan_to_num(1e9)).topk(8).indices.tolist()
    ray.get(engines[0].extension_call.remote("swap_resident_logits", a, b))
    with pytest.raises(ProbeMismatchError, match=r"rollout worker 0: the engine's next-token distributions on the probe "
                                                 r"text differ from the trainer's by a KL of .* while the sampled "
                                                 r"tokens' logprobs agree within") as err:
        syncer.probe([0])
    print(f"full-distribution negative control (tokens {a} and {b} swapped): {err.value}")
    ray.get(engines[0].extension_call.remote("swap_resident_logits", a, b))
    assert syncer.probe([0])["sync/probe_full_kl"] <= DEFAULT_KL_TOLERANCE["float32"]
