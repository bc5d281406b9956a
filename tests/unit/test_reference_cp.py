"""The context-parallel reference (trainer.context_parallel_size = c > 1 with algo.kl_coef > 0,
actors/reference_cp.py) outside its ranks: c placement slots (orchestrator/placement/plan.py), c reference GPUs
for the sizer (orchestrator/sizing/measurements.py), the memory planner's c ranks with the tokens divided by c,
the constructor's check. Its logprobs: tests/integration/test_context_parallel.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.memory import estimate as est
from orchestrator.memory.estimate import RunShape
from orchestrator.memory.shapes import shape_from_numbers
from orchestrator.placement.plan import plan_job, reference_ranks
from orchestrator.sizing.measurements import role_gpus

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"
CP = ["trainer.num_workers=2", "trainer.context_parallel_size=2", "rollout.num_workers=1", "placement.resource=CPU"]
SMALL = shape_from_numbers(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=100)


def test_one_reference_slot_per_context_parallel_rank():
    cfg = load_config(CPU_YAML, CP + ["algo.kl_coef=0.01", "placement.reference_per_worker=0.25"])
    assert reference_ranks(cfg) == 2
    plan = plan_job(cfg, pin=False)
    # trainer ranks in bundles 0, 1, the engine in 2, the reference ranks in 3, 4, the reward actor last
    assert [s.bundle for s in plan.slots["reference"]] == [3, 4]
    assert [plan.groups[0].bundles[s.bundle] for s in plan.slots["reference"]] == [{"CPU": 0.25}] * 2
    colo = plan_job(load_config(CPU_YAML, CP + ["algo.kl_coef=0.01", "placement.mode=colocated"]), pin=False)
    # 2 devices: device k holds trainer rank k and reference rank k; device 0 the engine too
    assert [s.bundle for s in colo.slots["reference"]] == [0, 1]
    assert [s.resources for s in colo.slots["reference"]] == [{"CPU": 0.3333}, {"CPU": 0.5}]
    assert reference_ranks(load_config(CPU_YAML, CP + ["algo.kl_coef=0"])) == 0
    assert reference_ranks(load_config(CPU_YAML, ["algo.kl_coef=0.01"])) == 1


def test_the_sizer_counts_c_reference_devices():
    from omegaconf import OmegaConf

    gpus, _ = role_gpus(OmegaConf.create({"algo": {"kl_coef": 0.1}, "trainer": {"num_workers": 4,
                                                                                "context_parallel_size": 2}}))
    assert gpus["reference"] == 2 and gpus["trainer"] == 4
    assert role_gpus(OmegaConf.create({"algo": {"kl_coef": 0.1}}))[0]["reference"] == 1
    assert role_gpus(OmegaConf.create({"algo": {"kl_coef": 0.0}}))[0]["reference"] == 0


def test_the_planner_splits_the_reference_over_c_ranks():
    from orchestrator.memory.planner import plan_memory

    run = RunShape(seq_len=1024, response_len=512, context_parallel=4, trainer_ranks=4, reference=True, engines=0)
    ref = next(r for r in plan_memory(SMALL, run, None).roles if r.role == "reference")
    # 4 ranks, each the whole frozen model and 1/4 of the tokens: 256 x (2h + 3I) x 4; logits 2 x 4 x 128 x V
    assert ref.count == 4 and ref.parts["weights"] == SMALL.num_params * 2
    assert ref.parts["activations"] == 256 * (2 * 64 + 3 * 128) * 4 and ref.parts["logits"] == 2 * 4 * 128 * 100
    assert ref.parts == est.frozen_forward_bytes(SMALL, run, split=True)
    one = next(r for r in plan_memory(SMALL, RunShape(seq_len=1024, response_len=512, reference=True, engines=0),
                                      None).roles if r.role == "reference")
    assert one.count == 1 and one.parts["activations"] == 4 * ref.parts["activations"]


def test_the_planner_does_not_split_the_critic():
    from orchestrator.memory.planner import plan_memory

    split = RunShape(algorithm="ppo", seq_len=1024, response_len=512, context_parallel=2, trainer_ranks=2, engines=0)
    whole = RunShape(algorithm="ppo", seq_len=1024, response_len=512, trainer_ranks=2, engines=0)
    critic = [next(r for r in plan_memory(SMALL, run, None).roles if r.role == "critic") for run in (split, whole)]
    assert critic[0].parts == critic[1].parts  # the critic runs whole sequences whatever the trainer's c


def test_the_constructor_refuses_a_group_of_one():
    from actors.reference_cp import ContextParallelReference

    with pytest.raises(ValueError, match="rank 0 of world_size 1"):
        ContextParallelReference("unused", 1.0, 1, rank=0, world_size=1, group_name="g", timeout_s=1.0)
    with pytest.raises(ValueError, match="rank 2 of world_size 2"):
        ContextParallelReference("unused", 1.0, 1, rank=2, world_size=2, group_name="g", timeout_s=1.0)
