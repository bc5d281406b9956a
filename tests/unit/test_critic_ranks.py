"""`critic.num_workers` (C sharded critic ranks, actors/critic_sharded.py) outside the ranks themselves: the config
check, one placement bundle per rank (orchestrator/placement/plan.py), the memory planner's C ranks with the
sharded state divided by C (orchestrator/memory/), and the values the ranks' shares merge into."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.critic import merge_values
from orchestrator.config import load_config
from orchestrator.config.load import ConfigError
from orchestrator.placement.plan import plan_job

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"
BASE = ["algo.kl_coef=0", "rollout.num_workers=1", "placement.resource=CPU", "rollout.prompts_per_step=2",
        "rollout.n=4"]  # a batch of 8


def test_num_workers_defaults_to_one_and_is_checked_when_the_config_loads():
    assert load_config(CPU_YAML, BASE + ["algo.estimator=gae"]).critic.num_workers == 1
    assert load_config(CPU_YAML, BASE + ["algo.estimator=gae", "critic.num_workers=4"]).critic.num_workers == 4
    with pytest.raises(ConfigError, match="critic.num_workers"):
        load_config(CPU_YAML, BASE + ["algo.estimator=gae", "critic.num_workers=0"])
    with pytest.raises(ConfigError, match=r"critic.num_workers=3 must divide .*rollout.prompts_per_step \* rollout.n = 8"):
        load_config(CPU_YAML, BASE + ["algo.estimator=gae", "critic.num_workers=3"])
    assert load_config(CPU_YAML, BASE + ["critic.num_workers=3"]).critic.num_workers == 3  # no critic: not read


def test_each_critic_rank_gets_its_own_bundle():
    plan = plan_job(load_config(CPU_YAML, BASE + ["algo.estimator=gae", "critic.num_workers=2",
                                                  "critic.per_worker=0.25"]), pin=False)
    slots = plan.slots["critic"]
    assert [s.bundle for s in slots] == [2, 3] and [plan.groups[0].bundles[s.bundle] for s in slots] == [{"CPU": 0.25}] * 2
    colo = plan_job(load_config(CPU_YAML, BASE + ["algo.estimator=gae", "critic.num_workers=2",
                                                  "placement.mode=colocated"]), pin=False)
    # 2 devices (critic rank 1 needs the second): device 0 holds trainer, engine, critic 0; device 1 critic 1 only
    assert [s.bundle for s in colo.slots["critic"]] == [0, 1]
    assert [s.resources for s in colo.slots["critic"]] == [{"CPU": 0.3333}, {"CPU": 1.0}]
    assert colo.groups[0].bundles[:2] == [{"CPU": 1.0}, {"CPU": 1.0}]


def test_memory_plan_counts_c_critic_ranks_with_the_state_divided(tmp_path):
    from orchestrator.memory.params import PRESETS
    from orchestrator.memory.preflight import plan_for_config

    (tmp_path / "config.json").write_text(json.dumps(dict(PRESETS["smollm2-135m"], architectures=["LlamaForCausalLM"],
                                                          head_dim=64)))
    base = ["placement.resource=GPU", "memory.device_gib=80", "rollout.num_workers=1", "algo.estimator=gae",
            "placement.trainer_per_worker=0.5", "placement.rollout_per_worker=0.5"]
    one = next(r for r in plan_for_config(load_config(CPU_YAML, base), tmp_path).roles if r.role == "critic")
    plan = plan_for_config(load_config(CPU_YAML, base + ["critic.num_workers=2"]), tmp_path)
    two = next(r for r in plan.roles if r.role == "critic")
    n = plan.model.num_params
    assert (one.count, two.count) == (1, 2) and plan.run.critic_ranks == 2
    assert (two.parts["weights"], two.parts["grads"], two.parts["optimizer"]) == (4 * n // 2, 4 * n // 2, 8 * n // 2)
    assert "critic GPU (x2)" in [d.name for d in plan.devices]


def test_memory_planner_suggests_more_critic_ranks_when_a_critic_gpu_does_not_fit():
    from orchestrator.memory.estimate import GIB, RunShape
    from orchestrator.memory.params import PRESETS
    from orchestrator.memory.shapes import model_shape
    from orchestrator.memory.planner import plan_memory

    model = model_shape(dict(PRESETS["qwen2.5-7b"], architectures=["Qwen2ForCausalLM"]))
    run = RunShape(algorithm="ppo", trainer_ranks=8, lora_rank=16, critic_ranks=1, critic_micro_batch_size=1)
    plan = plan_memory(model, run, 80 * GIB)
    assert not plan.fits and any("critic.num_workers=" in s for s in plan.suggestions)


def test_merge_values_orders_the_ranks_shares_and_names_a_missing_sample():
    assert merge_values(3, [{0: [0.5], 2: [1.0, 2.0]}, {1: [3.0]}]) == [[0.5], [3.0], [1.0, 2.0]]
    with pytest.raises(ValueError, match=r"samples \[1\] of 3"):
        merge_values(3, [{0: [0.5], 2: [1.0]}])


def test_plan_memory_cli_takes_the_critic_ranks(capsys):
    from orchestrator.cli import main

    main(["plan", "memory", "--model", "qwen2.5-7b", "--device-gib", "80", "--trainer-gpus", "8", "--algorithm", "ppo",
          "--critic-gpus", "2"])
    assert "critic GPU (x2): critic: 70.85 of 80.00 GiB: fits" in capsys.readouterr().out
