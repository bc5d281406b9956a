"""The 7B example of the Helm chart (values-7b-2x8gpu.yaml) fits 2 nodes x 8 GPUs of 80 GB, by the run's
own pre-flight memory planner: the chart is rendered, the ConfigMap's run.yaml (what the entrypoint
reads) is planned with Qwen2.5-7B's config.json shape, every role must fit, and the placement plan must
ask for no more than the 16 GPUs of the two workers. If an edit of the example (or of the planner's
formulas) makes a role stop fitting, this test fails with the planner's table.

    pytest tests/deploy/test_helm_7b_plan.py -q
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.memory.estimate import GIB
from orchestrator.memory.params import PRESETS, count_params
from orchestrator.memory.planner import format_plan
from orchestrator.memory.preflight import plan_for_config
from orchestrator.placement.plan import plan_job, total_asked
from tests.deploy.test_helm_chart import EXAMPLE_7B, one, render, run_config_and_argv, values_file

GPUS = 2 * 8  # worker.replicas x worker.gpus of the example


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """(run config file as the entrypoint reads it, entrypoint overrides, a Qwen2.5-7B config.json folder)."""
    tmp = tmp_path_factory.mktemp("helm7b")
    values = values_file(EXAMPLE_7B)
    objects = render(values, name="grpo-7b")
    config_file, overrides = run_config_and_argv(objects, tmp)
    model = tmp / "Qwen2.5-7B-Instruct"
    model.mkdir()
    # Qwen/Qwen2.5-7B-Instruct's config.json, shape keys (orchestrator/memory/params.py PRESETS).
    (model / "config.json").write_text(json.dumps(dict(PRESETS["qwen2.5-7b"], architectures=["Qwen2ForCausalLM"])))
    return config_file, overrides, model, values


def _plan(example, *extra):
    config_file, overrides, model, _ = example
    cfg = load_config(config_file, [*overrides, f"model.path={model}", *extra])
    return cfg, plan_for_config(cfg, model)


def test_7b_example_fits_every_role_on_80gb_gpus(example):
    cfg, plan = _plan(example)
    assert 7.6e9 < count_params(PRESETS["qwen2.5-7b"]).total < 7.7e9  # a 7B model, not a smaller stand-in
    # The FSDP2 layout the example documents.
    assert cfg.trainer.num_workers == 8 and cfg.trainer.gradient_checkpointing
    assert cfg.trainer.precision == "bf16-autocast"
    assert cfg.memory.device_gib <= 80  # judged against at most an 80 GB GPU
    text = format_plan(plan)
    assert plan.fits, text
    assert {r.role for r in plan.roles} == {"trainer", "rollout", "reference"}, text
    held = set()
    for device in plan.devices:
        # fits is None for a device of unknown size, which plan.fits would let through: require a verdict
        assert device.device_bytes == int(cfg.memory.device_gib * GIB), text
        assert device.fits is True and device.used_bytes <= device.device_bytes, text
        held |= set(device.roles)
    assert held == {"trainer", "rollout", "reference"}, text


def test_7b_example_fits_at_80_gib_and_not_without_fsdp(example):
    _, plan = _plan(example, "memory.device_gib=80")
    assert plan.fits and all(d.fits is True for d in plan.devices), format_plan(plan)
    # The planner is not vacuous here: one unsharded trainer rank (the old example) does not fit.
    _, single = _plan(example, "memory.device_gib=80", "trainer.num_workers=1")
    assert not single.fits, format_plan(single)
    trainer_gpu = next(d for d in single.devices if d.fits is False)
    assert trainer_gpu.used_bytes > 80 * GIB  # 16 bytes/parameter (113.5 GiB) + activations: 147.53 GiB


def test_7b_example_placement_asks_for_the_16_gpus_it_has(example):
    cfg, _ = _plan(example)
    _, _, _, values = example
    assert values["worker"]["replicas"] * values["worker"]["gpus"] == GPUS
    job = plan_job(cfg, pin=False)
    assert len(job.slots["trainer"]) == 8 and len(job.slots["rollout"]) == 8 and len(job.slots["reference"]) == 1
    asked = total_asked(job.groups)["GPU"]
    # 8 trainer ranks x 0.75 + 8 engines x 1 + the reference's 0.25: each trainer rank holds a GPU of its
    # own (two 0.75 shares cannot share one), so 8 + 8 GPUs are taken and the reference sits beside a rank.
    assert asked == pytest.approx(8 * 0.75 + 8 * 1.0 + 0.25)
    assert cfg.placement.trainer_per_worker > 0.5 and cfg.placement.rollout_per_worker == 1.0
    assert cfg.placement.trainer_per_worker + cfg.placement.reference_per_worker <= 1.0
    devices_taken = cfg.trainer.num_workers + cfg.rollout.num_workers * cfg.rollout.tensor_parallel_size
    assert devices_taken == GPUS


def test_7b_example_comment_quotes_the_planner(example):
    """The table in the example's header comment is the planner's current output, row for row (so the
    documented numbers cannot drift from what the pre-flight check computes)."""
    _, plan = _plan(example)
    printed = {line.strip() for line in format_plan(plan).splitlines()}
    quoted = [line[1:].strip() for line in EXAMPLE_7B.read_text().splitlines()
              if line.startswith("#   ") and ("trainer GPU" in line or "rollout GPU" in line or "role " in line)]
    assert len(quoted) == 6, quoted  # header, 3 role rows, 2 device verdicts
    assert [q for q in quoted if q not in printed] == [], format_plan(plan)
