"""Held-out evaluation in a run and from the command line (orchestrator/eval, docs/eval.md), tiny model on CPU.

- a 2-step run with eval.every_steps=2: eval rows at step 0 (before training) and step 2 (the end), with
  pass@k / avg@k / maj@k, length, truncation, per-function means and timing/eval_s; and the training rows
  (rewards, tokens, responses) exactly those of the same run without eval;
- (eval.holdout, no prompt a training step draws is an eval prompt: tests/integration/test_rollout_restart.py's
  run, which evaluates held-out prompts)
- `rl-orch eval` on the run's checkpoint and on the base model: a table and a JSON file.
The 2-step run without eval is made once (`plain_run`): the training rows compare against it, and
`rl-orch eval` reads its final checkpoint (step 2).
"""
from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.sizing.measurements import PHASE_KEYS, measure_rows
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
EVAL = ["eval.every_steps=2", "eval.data=arith", "eval.num_prompts=3", "eval.n=2", "eval.temperature=1.0",
        "eval.k=[1,2]", "eval.max_new_tokens=8"]
TRAINING_KEYS = ("reward/mean", "reward/std", "rollout/tokens", "rollout/response_len_mean")  # sampled: exact


def _run(tiny_model, out, *extra):
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out) + list(extra))
    controller = GRPOController(cfg)
    try:
        return controller, controller.run()
    finally:
        controller.shutdown()


@pytest.fixture(scope="module")
def plain_run(ray_local, tiny_model, tmp_path_factory):
    """The tiny 2-step run without eval (eval.every_steps=0): its rows and its final checkpoint (step 2)."""
    return _run(tiny_model, tmp_path_factory.mktemp("plain"))[1]


def test_eval_rows_and_training_unchanged(ray_local, tiny_model, tmp_path, plain_run):
    plain = plain_run
    _, result = _run(tiny_model, tmp_path / "eval", *EVAL)
    rows = result.rows
    assert [r["step"] for r in rows] == [0, 1, 2]
    evals = [r for r in rows if "eval/pass_at_1" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        for key in ("eval/pass_at_2", "eval/avg_at_2", "eval/maj_at_2", "eval/response_len_mean",
                    "eval/truncated_frac", "eval/reward_mean", "eval/reward_accuracy_mean", "timing/eval_s"):
            assert key in r, key
        assert r["eval/prompts"] == 3 and r["eval/samples"] == 6
        assert 0 <= r["eval/pass_at_1"] <= r["eval/pass_at_2"] <= 1
        assert 0 < r["eval/response_len_mean"] <= 8 and r["timing/eval_s"] > 0
    assert evals[0]["eval/weight_version"] == 0 and evals[1]["eval/weight_version"] == 2
    assert not [k for k in rows[0] if k.startswith(("reward/", "rollout/", "actor/", "sync/", "roles/"))]  # eval only
    assert {k for k in rows[0] if k.startswith("timing/")} == {"timing/eval_s"}
    # eval changes nothing of training: same rewards, tokens, loss per step as the run without eval
    train = [r for r in rows if r["step"] > 0]
    for a, b in zip(plain.rows, train):
        assert {k: a[k] for k in TRAINING_KEYS} == {k: b[k] for k in TRAINING_KEYS}
        assert a["actor/loss"] == pytest.approx(b["actor/loss"], rel=1e-4, abs=1e-6)  # vLLM CPU logprob jitter
    assert not any(k.startswith("eval/") for k in rows[1])
    # the sizer reads training phases only
    assert "eval" not in PHASE_KEYS
    assert "eval" not in measure_rows(train, {"rollout": 1, "trainer": 1, "reference": 0}, "m", "t", {}).phases


def test_rl_orch_eval_checkpoint_and_base(ray_local, tiny_model, tmp_path, capsys, plain_run):
    result = plain_run  # its final checkpoint: step 2
    assert result.checkpoint.endswith("step_000002")
    common = ["--config", "configs/grpo_arith_cpu.yaml", "--data", "arith",
              *tiny_overrides(tiny_model, tmp_path / "ignored"), "eval.num_prompts=4", "eval.max_new_tokens=6"]
    common = [o for o in common if not o.startswith("run.output_dir=")]
    out = tmp_path / "ckpt_eval.json"
    assert main(["eval", "--checkpoint", result.checkpoint, "--out", str(out), *common,
                 f"run.output_dir={tmp_path / 'e1'}"]) == 0
    printed = capsys.readouterr().out
    assert "eval/pass_at_1" in printed and "written:" in printed
    report = json.loads(out.read_text())
    assert report["metrics"]["eval/prompts"] == 4 and report["metrics"]["eval/weight_version"] == 2
    assert report["eval"]["data"] == "arith"
    assert main(["eval", "--checkpoint", "base", *common, f"run.output_dir={tmp_path / 'e2'}"]) == 0
    base = json.loads((tmp_path / "e2" / "eval.json").read_text())
    assert base["metrics"]["eval/weight_version"] == 0 and 0 <= base["metrics"]["eval/pass_at_1"] <= 1
    assert main(["eval", "--checkpoint", "base", "--config", "configs/grpo_arith_cpu.yaml",
                 "eval.data=", "eval.every_steps=0", f"run.output_dir={tmp_path / 'e3'}"]) == 2
