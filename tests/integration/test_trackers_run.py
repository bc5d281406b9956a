"""Trackers and completion samples through the controller on Ray (local, CPU) and vLLM with the tiny model: the
demo config's `metrics.trackers: [tensorboard]` writes every row metric as TensorBoard scalars (read back with
TensorBoard's own event reader) and the samples as text and samples.jsonl; a resume from an older checkpoint
redoes a step without any step showing twice."""
from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration


def _run(cfg):
    controller = GRPOController(cfg)
    try:
        return controller.run()
    finally:
        controller.shutdown()


def test_tensorboard_and_samples_from_a_run_and_its_resume(ray_local, tiny_model, tmp_path):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    over = tiny_overrides(tiny_model, tmp_path, **{"trainer.total_steps": 3, "checkpoint.every_steps": 1,
                                                   "checkpoint.keep_last": 3, "metrics.samples_every": 1,
                                                   "metrics.samples_n": 2})
    cfg = load_config("configs/grpo_arith_cpu.yaml", over)
    assert list(cfg.metrics.trackers) == ["tensorboard"]
    first = _run(cfg)
    # resume from step 2's checkpoint: step 3 is redone
    resumed = _run(load_config("configs/grpo_arith_cpu.yaml", over + [f"checkpoint.resume={tmp_path / 'ckpt' / 'step_000002'}"]))
    assert [r["step"] for r in resumed.rows] == [1, 2, 3]

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})  # the reader TensorBoard serves
    acc.Reload()
    for name in ("reward/mean", "timing/generate_s", "actor/loss"):
        assert [e.step for e in acc.Tensors(name)] == [1, 2, 3], name  # no step twice after the resume
    last = float(tensor_util.make_ndarray(acc.Tensors("reward/mean")[-1].tensor_proto))
    assert last == pytest.approx(resumed.rows[-1]["reward/mean"], abs=1e-6)
    numeric = {k for r in first.rows for k, v in r.items() if isinstance(v, (int, float)) and k != "step"}
    assert numeric <= set(acc.Tags()["tensors"])  # every numeric JSONL metric is a TensorBoard scalar
    assert [t.step for t in acc.Tensors("samples/text_summary")] == [1, 2, 3]

    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 1, 2, 2, 3, 3]
    r = records[-1]
    assert r["completion"] and r["prompt"] and set(r["rewards"]) == {"accuracy"} and r["finish_reason"] in ("stop", "length")
    assert r["weight_version"] == 2 and r["response_len"] > 0 and isinstance(r["advantage"], float)
