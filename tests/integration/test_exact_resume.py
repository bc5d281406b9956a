"""Exact resume on Ray (local, CPU), tiny random model, vLLM on CPU: 3 steps + resume + 3 steps = 6 steps.

Run A trains 6 steps (checkpoint every 3). Run B trains 3 steps, stops, and a new controller resumes B from
its latest checkpoint to step 6. Every step's rewards, losses and other training metrics, and the final
policy weights, are equal bit for bit: each sample's vLLM seed comes from (rollout.seed, step, group,
sample) (orchestrator/rollout/seeds.py), the trainer's RNG, optimizer, scheduler and the prompt loader are
checkpointed, and in placement.mode=disaggregated_async the batch generated before the checkpoint (by
weights nobody holds after it) is kept in the checkpoint and trained on after the resume.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"
# wall-clock, throughput and memory readings differ run to run; everything else must not
VOLATILE_PREFIXES = ("timing/", "roles/", "memory/")
VOLATILE_SUFFIXES = ("_s", "per_s", "_frac_busy", "_frac_idle")


def _run(tiny_model, out, mode: str, *extra):
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{
        "rollout.max_new_tokens": 16, "checkpoint.every_steps": 3, "placement.mode": mode}) + [REWARD, *extra])
    controller = GRPOController(cfg)
    try:
        return controller, controller.run()
    finally:
        controller.shutdown()


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items()
            if not k.startswith(VOLATILE_PREFIXES) and not k.endswith(VOLATILE_SUFFIXES)}


@pytest.mark.parametrize("mode", ["disaggregated", "disaggregated_async"])
def test_three_steps_resume_three_steps_equals_six_steps(ray_local, tiny_model, tmp_path, mode, capsys):
    _, whole = _run(tiny_model, tmp_path / "a", mode, "trainer.total_steps=6")
    _run(tiny_model, tmp_path / "b", mode, "trainer.total_steps=3")
    resumed, split = _run(tiny_model, tmp_path / "b", mode, "trainer.total_steps=6", "checkpoint.resume=latest")
    assert resumed.start_step == 3
    assert f"loaded checkpoint {tmp_path / 'b' / 'ckpt' / 'step_000003'} (step 3); continuing at step 4" in \
        capsys.readouterr().out

    assert [r["step"] for r in whole.rows] == [r["step"] for r in split.rows] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(whole.rows, split.rows):
        assert _stable(a) == _stable(b), f"step {a['step']}"
    assert {"reward/mean", "actor/loss", "actor/grad_norm", "rollout/response_len_mean"} <= set(_stable(whole.rows[-1]))
    assert len({r["reward/mean"] for r in whole.rows}) > 1  # the runs really sample: rewards vary by step
    if mode == "disaggregated_async":  # step 4 trained the batch generated before the checkpoint, one step off
        assert [r["async/staleness"] for r in split.rows] == [0, 1, 1, 1, 1, 1]

    a = load_file(f"{whole.checkpoint}/policy/model.safetensors")
    b = load_file(f"{split.checkpoint}/policy/model.safetensors")
    initial = load_file(str(tiny_model / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], initial[k]) for k in a)  # and they trained
