"""Config validation and the placement plan for trainer.num_workers (D FSDP2 trainer ranks); no Ray."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.placement.groups import plan_bundles

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_num_workers_must_be_at_least_one(bad):
    with pytest.raises(ConfigError, match=rf"trainer.num_workers={bad} must be >= 1"):
        load_config(CPU_YAML, [f"trainer.num_workers={bad}"])


def test_each_mini_batch_must_split_evenly_over_the_ranks():
    # 4 prompts x 8 samples / 2 mini-batches = 16 per mini-batch: 2 and 4 ranks divide it, 3 does not
    for d in (2, 4, 16):
        assert load_config(CPU_YAML, [f"trainer.num_workers={d}", "trainer.mini_batches=2"]).trainer.num_workers == d
    with pytest.raises(ConfigError, match=r"trainer.num_workers=3 must divide .* = 16"):
        load_config(CPU_YAML, ["trainer.num_workers=3", "trainer.mini_batches=2"])
    with pytest.raises(ConfigError, match=r"trainer.num_workers=32 must divide .* = 16"):
        load_config(CPU_YAML, ["trainer.num_workers=32", "trainer.mini_batches=2"])
    # 3 prompts x 2 samples = 6: 3 ranks divide it
    assert load_config(CPU_YAML, ["rollout.prompts_per_step=3", "rollout.n=2", "trainer.num_workers=3"])


def test_lora_and_packing_are_accepted_with_several_ranks():
    # both work on FSDP2 ranks (actors/trainer/sharded.py; tests/integration/test_fsdp_packing_lora.py)
    cfg = load_config(CPU_YAML, ["trainer.num_workers=2", "trainer.lora.rank=8"])
    assert (cfg.trainer.num_workers, cfg.trainer.lora.rank) == (2, 8)
    cfg = load_config(CPU_YAML, ["trainer.num_workers=2", "trainer.packing=true", "trainer.micro_batch_tokens=4096"])
    assert (cfg.trainer.num_workers, cfg.trainer.packing) == (2, True)
    # the per-rank checks still apply: the packing budget must hold the longest sequence
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_tokens=8 is smaller than the longest sequence"):
        load_config(CPU_YAML, ["trainer.num_workers=2", "trainer.packing=true", "trainer.micro_batch_tokens=8"])


def test_the_plan_has_one_trainer_bundle_per_rank_first():
    plan = plan_bundles(load_config(CPU_YAML, ["trainer.num_workers=4", "placement.trainer_per_worker=0.25",
                                               "rollout.num_workers=1", "algo.kl_coef=0"]))
    assert plan.roles == {"trainer": [0, 1, 2, 3], "rollout": [4], "reward": [5]}
    assert plan.bundles[:4] == [{"CPU": 0.25}] * 4
