"""DAPO on Ray (local, CPU), tiny random model, vLLM on CPU: dynamic sampling trains only informative groups and
resumes exactly (2 steps + resume + 2 steps = 4 steps: every row and the final weights; this is also the exact-resume
test of rollout.mode=sync, tests/integration/test_exact_resume.py); overlong shaping and filtering run through the trainer, in
the worked example of a rollout mode of one's own (docs/examples/rollout_mode_example.py).

The reward makes whole groups uniform on purpose: a prompt whose gold answer is even scores 1.0 for every sample
(a uniform group, dropped), an odd one scores by completion length (usually informative), so steps need more than
one round of prompts.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from orchestrator.config import load_config
from orchestrator.rollout.dynamic_sampling import ROUND_STRIDE
from orchestrator.controller import GRPOController
from tests.integration.conftest import tiny_overrides
from tests.integration.helpers import crashed_copy

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.dapo_rewards:parity_reward', weight: 1.0}]"
VOLATILE_PREFIXES = ("timing/", "roles/", "memory/")
VOLATILE_SUFFIXES = ("_s", "_s_mean", "seconds", "gbps", "_frac_busy", "_frac_idle", "_per_s")


def _run(tiny_model, out, *extra):
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{
        "rollout.max_new_tokens": 16, "checkpoint.every_steps": 2, "trainer.total_steps": 4,
        "algo.dynamic_sampling.enabled": "true", "algo.dynamic_sampling.max_rounds": 6,
        # no TIS: its weight exp(old - rollout) would carry vLLM CPU's logprob jitter between fresh engines (~1e-7)
        # into the gradients, which Adam amplifies past the 1e-5 below (tests/integration/test_exact_resume.py)
        "algo.tis_cap": "null"}) + [REWARD, *extra])
    controller = GRPOController(cfg)
    try:
        return controller, controller.run()
    finally:
        controller.shutdown()


def _stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE_PREFIXES) and not k.endswith(VOLATILE_SUFFIXES)}


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return abs(x - y) <= 1e-6 + 1e-5 * abs(y)
    return x == y


def test_dynamic_sampling_trains_informative_groups_and_resumes_exactly(ray_local, tiny_model, tmp_path):
    controller, whole = _run(tiny_model, tmp_path / "a")
    rows = whole.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["rollout/dyn_groups_generated"] == 2 * r["rollout/dyn_rounds"]  # rounds of prompts_per_step = 2
        assert r["rollout/dyn_groups_kept"] + r["rollout/dyn_groups_padded"] == 2
        if r["rollout/dyn_groups_padded"] == 0:  # enough informative groups: no uniform group trained
            assert r["rollout/groups_mixed_frac"] == 1.0
        assert math.isfinite(r["actor/loss"])
    assert any(r["rollout/dyn_rounds"] > 1 for r in rows), [r["rollout/dyn_rounds"] for r in rows]
    # the loader accounts for every prompt drawn: its position after step 2 is the groups generated in steps 1-2
    state = json.loads((tmp_path / "a" / "ckpt" / "step_000002" / "state.json").read_text())["loader"]
    assert state["epoch"] * state["size"] + state["position"] == sum(r["rollout/dyn_groups_generated"] for r in rows[:2])
    # the last trained batch's group ids: round 0 ids are step * 2 + i, extra rounds add r * ROUND_STRIDE
    gids = {t.group_id for t in controller.scored.trajs}
    assert all((g % ROUND_STRIDE) // 2 == 4 and g // ROUND_STRIDE < rows[-1]["rollout/dyn_rounds"] for g in gids), gids

    crashed_copy(tmp_path / "a", tmp_path / "b", 2)  # a run that died as step 3 began
    resumed, split = _run(tiny_model, tmp_path / "b", "checkpoint.resume=latest")
    assert resumed.start_step == 2 and [r["step"] for r in split.rows] == [1, 2, 3, 4]
    assert {"reward/mean", "actor/loss", "actor/grad_norm", "rollout/response_len_mean"} <= set(_stable(rows[-1]))
    differ = [(a["step"], k, a.get(k), b.get(k)) for a, b in zip(rows, split.rows)
              for k in sorted(set(_stable(a)) | set(_stable(b))) if not _same(a.get(k), b.get(k))]
    assert not differ, differ
    assert [r["reward/mean"] for r in rows] == [r["reward/mean"] for r in split.rows]
    # the final policies too (rollout.mode=sync's exact resume: tests/integration/test_exact_resume.py checks
    # one_step_off): bitwise where the kernels are, else within 1e-3 of how far training moved the weights
    a, b = load_file(f"{whole.checkpoint}/policy/model.safetensors"), load_file(f"{split.checkpoint}/policy/model.safetensors")
    initial = load_file(str(tiny_model / "model.safetensors"))
    assert a.keys() == b.keys()
    moved = torch.sqrt(sum(((a[k] - initial[k]) ** 2).sum() for k in a))
    apart = torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a))
    assert moved > 0 and apart <= 1e-3 * moved, (float(apart), float(moved))


def test_overlong_penalty_and_filter_train_in_a_rollout_mode_of_ones_own(ray_local, tiny_model, tmp_path):
    """Also the rollout-mode seam's worked example on Ray, named by its dotted path (docs/examples/
    rollout_mode_example.py, overfit_one_batch): every step trains the first step's prompts, the loader never moves."""
    out = tmp_path / "o"
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{
        "rollout.max_new_tokens": 12, "reward.overlong_penalty.enabled": "true",
        "reward.overlong_penalty.cache_len": 6, "algo.overlong_filter": "true",
        "rollout.mode": "docs.examples.rollout_mode_example"}) +
        ["reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"])
    controller = GRPOController(cfg)
    start = controller.loader.state_dict()
    try:
        rows = controller.run().rows
    finally:
        controller.shutdown()
    total, per_step = cfg.trainer.total_steps, cfg.rollout.prompts_per_step
    assert [r["step"] for r in rows] == list(range(1, total + 1)) and controller.loader.state_dict() == start
    assert sorted({t.group_id for t in controller.scored.trajs}) == [total * per_step + i for i in range(per_step)]
    first = [controller.prompt_ids[k] for k in controller.loader.next_batch()]  # what every step drew
    assert sorted(map(tuple, first)) == sorted({tuple(t.prompt_ids) for t in controller.scored.trajs})
    for r in rows:
        # a random model runs to max_new_tokens often: those samples get -1 (the whole ramp) and leave the loss
        assert -1.0 <= r["reward/overlong_penalty_mean"] <= 0.0
        assert r["reward/overlong_penalty_mean"] <= -r["rollout/truncated_frac"] + 1e-9
        assert r["rollout/overlong_filtered_frac"] + r["rollout/overlong_unfiltered"] / 8 == pytest.approx(
            r["rollout/truncated_frac"])
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
    assert any(r["rollout/truncated_frac"] > 0 for r in rows)
