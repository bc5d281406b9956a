"""`weight_sync.strategy: auto` picks the cost model's cheapest strategy for the run's config."""
from __future__ import annotations

from orchestrator.config import load_config
from orchestrator.weight_sync import choose_strategy, predict_sync, setup_from_fabric
from orchestrator.weight_sync.registry import outside_ray_names
from orchestrator.weight_sync.choose import choose_for_config


def _cfg(*over):
    return load_config("configs/grpo_arith_cpu.yaml", ["weight_sync.strategy=auto", *over])


def test_auto_matches_the_cost_model_and_prints_every_strategy():
    cfg = _cfg("rollout.num_workers=2", "weight_sync.fabric.intra_node=nvlink")
    strategy, table = choose_for_config(cfg, 135_000_000, 540_000_000)
    setup = setup_from_fabric(135_000_000, 4.0, 2, 1, 0, intra="nvlink", inter="eth25", fs_write_gbps=1.0,
                              fs_read_gbps=2.0, bucket_mb=256, changed_fraction=1.0, max_changed_fraction=0.5)
    assert strategy == choose_strategy(setup) == "nccl"
    for name, est in predict_sync(setup).items():
        assert name in table and f"{est.seconds:9.3f}" in table


def test_auto_prefers_delta_for_bf16_across_slow_ethernet():
    cfg = _cfg("rollout.dtype=bfloat16", "rollout.num_workers=4", "weight_sync.fabric.engine_nodes=4",
               "weight_sync.fabric.inter_node=eth25", "weight_sync.fabric.intra_node=nvlink")
    numel = 7_000_000_000
    strategy, _ = choose_for_config(cfg, numel, 2 * numel)
    setup = setup_from_fabric(numel, 2.0, 4, 1, 4, intra="nvlink", inter="eth25", fs_write_gbps=1.0,
                              fs_read_gbps=2.0, bucket_mb=256, changed_fraction=0.25, max_changed_fraction=0.5)
    assert strategy == choose_strategy(setup)
    assert predict_sync(setup)["delta"].seconds < predict_sync(setup)["object_store"].seconds


def test_auto_chooses_among_the_strategies_an_async_llm_engine_core_can_load():
    """rollout.engine=async_llm: vLLM's engine core is no Ray worker, so `auto` picks among the strategies whose
    receiver runs outside Ray (nccl would win this setup otherwise, as above)."""
    over = ("rollout.num_workers=2", "weight_sync.fabric.intra_node=nvlink")
    assert choose_for_config(_cfg(*over), 135_000_000, 540_000_000)[0] == "nccl"
    strategy, table = choose_for_config(_cfg(*over, "rollout.engine=async_llm"), 135_000_000, 540_000_000)
    assert strategy in ("disk", "object_store") and "nccl" in table
    assert set(outside_ray_names()) == {"disk", "object_store", "vllm_nccl", "vllm_ipc"}  # vllm_*: no predictor yet
