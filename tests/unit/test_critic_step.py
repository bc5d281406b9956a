"""The controller's side of PPO with a critic (orchestrator/critic_step.py) with fake actors (no Ray), and the
critic's placement bundle (orchestrator/placement/plan.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from orchestrator.algo import AdvantageInputs, TrainBatch, compute_token_advantages
from orchestrator.algo.gae import gae_advantages_returns, token_level_rewards
from orchestrator.checkpoint import read_manifest, verify_manifest, write_manifest
from orchestrator.config import load_config
from orchestrator.critic_step import CriticStep, critic_checkpoint
from orchestrator.placement.plan import plan_job

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"


class _Remote:
    """`actor.method.remote(*args)` runs `fn(*args)` at once; `job.wait` returns the value."""

    def __init__(self, fn):
        self.remote = fn


def _job(critic=None, trainer=None):
    return SimpleNamespace(wait=lambda x: x, actors=SimpleNamespace(critic=critic, trainer=trainer),
                           model_path="/models/tiny")


def _trajs():
    return [SimpleNamespace(prompt_ids=[1, 2], response_ids=[5, 6, 7]), SimpleNamespace(prompt_ids=[3], response_ids=[8])]


def test_without_a_critic_the_estimator_runs_as_before():
    cfg = load_config(CPU_YAML, [])
    step = CriticStep(_job(), cfg)
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([[1, 1, 1], [1, 0, 0]]))
    row: dict = {}
    assert torch.equal(step.advantages(_trajs(), inputs, row), compute_token_advantages("grpo", inputs, cfg.algo))
    assert row == {} and step.start_update(None) is None and step.finish_update(None) == {}


def test_gae_asks_the_critic_for_values_and_trains_it_on_the_returns():
    cfg = load_config(CPU_YAML, ["algo.estimator=gae", "algo.gamma=0.9", "algo.lam=0.8"])
    values = [[0.5, 0.6, 0.7], [0.2]]
    updates = []
    critic = SimpleNamespace(values=_Remote(lambda p, r: values),
                             update=_Remote(lambda *a: updates.append(a) or {"critic/value_loss": 0.5}))
    step = CriticStep(_job(critic), cfg)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask)
    row: dict = {}
    adv = step.advantages(_trajs(), inputs, row)
    raw, ret = gae_advantages_returns(token_level_rewards(inputs.rewards, mask),
                                      torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.0, 0.0]]), mask, 0.9, 0.8)
    assert ret[0].tolist() == pytest.approx([0.71712, 0.846, 1.0], abs=1e-6)  # the hand-computed GAE example
    assert adv.shape == (2, 3) and adv[1, 1:].tolist() == [0.0, 0.0]
    assert row["critic/values_mean"] == pytest.approx(0.5) and row["critic/returns_mean"] == pytest.approx(
        float(ret[mask != 0].mean()))
    batch = TrainBatch([[1, 2], [3]], [[5, 6, 7], [8]], [[0.0] * 3, [0.0]], [[0.0] * 3, [0.0]])
    assert step.finish_update(step.start_update(batch)) == {"critic/value_loss": 0.5}
    (prompts, responses, returns, old, resp_mask), = updates
    assert returns[0] == pytest.approx([0.71712, 0.846, 1.0], abs=1e-6) and old == values and resp_mask is None
    with pytest.raises(RuntimeError, match="before CriticStep.advantages"):
        step.start_update(batch)  # the returns are spent: a second update would train on stale targets


def test_critic_checkpoint_is_one_atomic_folder_under_one_manifest(tmp_path):
    def trainer_save(folder, extra):
        (Path(folder) / "policy").mkdir(parents=True)
        (Path(folder) / "policy" / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (Path(folder) / "state.json").write_text(json.dumps(extra))
        write_manifest(folder, step=extra["step"], base_model="/models/tiny")
        return folder

    def critic_save(folder):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "value_model.safetensors").write_bytes(b"weights")
        return folder

    job = _job(critic=SimpleNamespace(save=_Remote(critic_save)), trainer=SimpleNamespace(save_checkpoint=_Remote(trainer_save)))
    folder = tmp_path / "ckpt" / "step_000003"
    assert critic_checkpoint(job, folder, {"step": 3}) == str(folder)
    assert verify_manifest(folder) == []
    manifest = read_manifest(folder)
    assert manifest["step"] == 3 and "critic/value_model.safetensors" in manifest["files"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_000003"]  # no temporary folder left


def test_critic_placement_bundle():
    base = ["algo.kl_coef=0", "rollout.num_workers=1", "placement.resource=CPU"]
    plan = plan_job(load_config(CPU_YAML, base + ["algo.estimator=gae", "critic.per_worker=0.25"]), pin=False)
    assert [s.bundle for s in plan.slots["critic"]] == [2] and plan.groups[0].bundles[2] == {"CPU": 0.25}
    assert "critic" not in plan_job(load_config(CPU_YAML, base), pin=False).slots
    colo = plan_job(load_config(CPU_YAML, base + ["algo.estimator=gae", "placement.mode=colocated"]), pin=False)
    assert colo.slots["critic"][0].bundle == 0 and colo.slots["critic"][0].resources == {"CPU": 0.3333}
    assert colo.slots["trainer"][0].resources == {"CPU": 0.3333}


def test_prometheus_serves_the_critic_keys():
    from prometheus_client import generate_latest

    from orchestrator.metrics.prometheus import PrometheusExporter

    exporter = PrometheusExporter("127.0.0.1", 0, "t")
    try:
        exporter.log_row({"step": 1, "critic/value_loss": 0.25, "critic/explained_var": -0.5})
        text = generate_latest(exporter.registry).decode()
    finally:
        exporter.close()
    assert 'rl_orch_critic_value{name="value_loss",run="t"} 0.25' in text
    assert 'rl_orch_critic_value{name="explained_var",run="t"} -0.5' in text


def test_memory_plan_counts_the_critic_as_the_run_starts_it(tmp_path):
    """algo.estimator=gae: one critic process of full fine-tuning (4 + 4 + 8 bytes a parameter, no LoRA, unsharded,
    in critic.micro_batch_size micro-batches), on its own GPU unless its fraction fits beside the trainer's."""
    import dataclasses

    from orchestrator.memory import estimate as est
    from orchestrator.memory.params import PRESETS
    from orchestrator.memory.preflight import plan_for_config

    (tmp_path / "config.json").write_text(json.dumps(dict(PRESETS["smollm2-135m"], architectures=["LlamaForCausalLM"],
                                                          head_dim=64)))
    base = ["placement.resource=GPU", "memory.device_gib=80", "trainer.num_workers=2", "trainer.lora.rank=8",
            "placement.trainer_per_worker=0.5", "placement.rollout_per_worker=0.5", "rollout.num_workers=1"]
    plan = plan_for_config(load_config(CPU_YAML, base + ["algo.estimator=gae", "critic.micro_batch_size=2"]), tmp_path)
    critic = next(r for r in plan.roles if r.role == "critic")
    n = plan.model.num_params
    assert plan.run.algorithm == "ppo" and critic.count == 1
    assert (critic.parts["weights"], critic.parts["grads"], critic.parts["optimizer"]) == (4 * n, 4 * n, 8 * n)
    expect = est.critic_bytes(plan.model, dataclasses.replace(plan.run, trainer_ranks=1, lora_rank=0, packing_tokens=0,
                                                              micro_batch_size=2))
    assert critic.parts == expect and critic.parts["logits"] == 0
    assert ["critic"] in [d.roles for d in plan.devices]  # 0.5 + 0.5 fill the trainer GPU: the critic gets its own
    without = plan_for_config(load_config(CPU_YAML, base), tmp_path)
    assert without.run.algorithm == "grpo" and "critic" not in [r.role for r in without.roles]


def test_sizer_simulates_the_critic_beside_the_policy_update():
    """train 3 s, critic 5 s on its own device: sync waits for the slower critic, so a synchronous step is
    generate 10 + max(3, 5) + sync 1 = 16 s; colocated, the critic follows train on the shared GPUs: 10 + 3 + 5 + 1."""
    from orchestrator.sizing.measurements import RunMeasurement, fit_workload
    from orchestrator.sizing.simulator import StepCosts, simulate

    with_critic = StepCosts(generate_s=10, train_s=3, sync_s=1, critic_s=5)
    assert simulate("disaggregated", with_critic).step_s == pytest.approx(16.0)
    assert simulate("disaggregated", StepCosts(generate_s=10, train_s=3, sync_s=1)).step_s == pytest.approx(14.0)
    assert simulate("colocated", with_critic).step_s == pytest.approx(19.0)
    assert simulate("disaggregated", with_critic).busy["critic"] == pytest.approx(5 / 16)
    runs = [RunMeasurement("m", {"rollout": 1, "trainer": 1, "reference": 0},
                           {"generate": 10.0, "train": 5.0, "critic": 4.0}, 100.0, 3, 4, "test")]
    workload, notes = fit_workload(runs)
    assert workload.critic_s == pytest.approx(4.0) and any("critic update" in n for n in notes)


def test_a_dead_critic_is_supervised_like_the_trainer():
    from orchestrator.runtime.supervisor import Failure, supervised

    dead = Failure("critic", "critic actor", "dead")
    assert supervised([Failure("rollout", "rollout worker 0", "dead"), dead]) == [dead]
