"""Resume through the controller on Ray (local, CPU) and vLLM with the tiny model: the run's own command run
again (`checkpoint.resume: auto`, the default) skips a torn newest checkpoint with a warning naming the file,
loads the previous one (after verifying every file against its manifest), says so in one line and continues.
The first run checkpoints by time (`checkpoint.every_minutes`)."""
from __future__ import annotations

import pytest
import ray

from orchestrator.checkpoint import CheckpointWarning, read_manifest, verify_manifest
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


def _cfg(tiny_model, out, *extra):
    return load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + [REWARD, *extra])


def test_a_rerun_skips_the_torn_newest_checkpoint_and_continues(ray_local, tiny_model, tmp_path, capsys):
    # every_minutes=1e-4 (6 ms): each step outlasts it, so each step ends with a checkpoint (every_steps is 0)
    first = GRPOController(_cfg(tiny_model, tmp_path, "checkpoint.every_minutes=1e-4", "checkpoint.keep_last=3"))
    try:
        first.run()
    finally:
        first.shutdown()
    one, two = tmp_path / "ckpt" / "step_000001", tmp_path / "ckpt" / "step_000002"
    assert verify_manifest(one) == [] and verify_manifest(two) == [] and read_manifest(two)["step"] == 2
    assert "policy/tokenizer_config.json" in read_manifest(two)["files"]  # the tokenizer files are covered too
    torn = two / "policy" / "model.safetensors"
    with open(torn, "r+b") as f:  # a crash or a full disk after the rename: the file lost its tail
        f.truncate(torn.stat().st_size // 2)

    with pytest.warns(CheckpointWarning, match=f"skipping {two}: {torn}: truncated"):
        second = GRPOController(_cfg(tiny_model, tmp_path, "trainer.total_steps=3"))  # the same command, auto
    assert second.resume_from == one
    try:
        result = second.run()
        assert ray.get(second.actors.trainer.get_step.remote()) == 3
    finally:
        second.shutdown()
    assert f"resume: loaded checkpoint {one} (after step 1); continuing at step 2 of 3" in capsys.readouterr().out
    assert second.start_step == 1 and [r["step"] for r in result.rows] == [1, 2, 3]
    assert result.checkpoint.endswith("step_000003") and verify_manifest(tmp_path / "ckpt" / "step_000003") == []
    assert verify_manifest(two) != [] and two.is_dir()  # the torn one is left alone, never pruned nor resumed
