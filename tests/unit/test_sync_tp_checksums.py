"""Weight-sync verification of tensor-parallel engines (rollout.tensor_parallel_size > 1).

Each vLLM worker of a TP engine holds shards of the weights, so a resident read-back on one worker can never
equal the trainer's full-tensor checksums. Each TP worker reports the checksums of the full tensors its weight
loader consumed; the engine requires all of its workers to agree (orchestrator.weight_sync.checksum.
combine_worker_reports). The collective sync gives each TP worker its own rank.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from actors.weight_sync import base, collective
from actors.weight_sync.transfer_engine import StrategyInitInfo, StrategyTransferEngine
from actors.weight_sync.vllm_extension import WeightReceiverExtension
from orchestrator.weight_sync import WeightMismatchError
from orchestrator.weight_sync.checksum import combine_worker_reports, group_checksums

GROUPS = {"model.layers.0.mlp": [1.5, 10.25, 6.0], "lm_head": [-2.0, 4.0, 3.0]}


def report(version: int = 3, groups=None, tp_rank: int = 0) -> dict:
    return {"version": version, "groups": dict(GROUPS if groups is None else groups), "tp_rank": tp_rank}


def test_one_worker_is_returned_unchanged() -> None:
    rep = report()
    assert combine_worker_reports([rep]) is rep


def test_agreeing_tp_workers_give_worker_zero_report() -> None:
    out = combine_worker_reports([report(tp_rank=0), report(tp_rank=1), report(tp_rank=2)])
    assert out["groups"] == GROUPS and out["version"] == 3 and out["tp_workers"] == 3


def test_tp_worker_on_another_version_is_named() -> None:
    with pytest.raises(WeightMismatchError, match=r"tensor-parallel worker 1 .* version 2, worker 0 holds 3"):
        combine_worker_reports([report(3), report(2)])


def test_tp_worker_with_a_different_group_is_named() -> None:
    bad = dict(GROUPS, lm_head=[-2.0, 4.5, 3.0])  # one corrupted value changes the sum of squares
    with pytest.raises(WeightMismatchError, match=r"tensor-parallel worker 1 .*'lm_head'.*sum of squares"):
        combine_worker_reports([report(), report(groups=bad)])


def test_tp_worker_with_a_missing_or_extra_group_is_caught() -> None:
    fewer = {"lm_head": GROUPS["lm_head"]}
    with pytest.raises(WeightMismatchError, match="'model.layers.0.mlp' is missing"):
        combine_worker_reports([report(), report(groups=fewer)])
    with pytest.raises(WeightMismatchError, match="'model.layers.0.mlp' is missing"):
        combine_worker_reports([report(groups=fewer), report()])


def test_empty_report_list_is_refused() -> None:
    with pytest.raises(ValueError, match="no worker report"):
        combine_worker_reports([])


class _Runner:
    def __init__(self, model: torch.nn.Module):
        self.model = model

    def get_model(self) -> torch.nn.Module:
        return self.model


def _worker(model: torch.nn.Module) -> WeightReceiverExtension:
    """The extension over a model, with our weight-transfer engine as vLLM's worker would hold it."""
    w = WeightReceiverExtension()
    w.model_runner = _Runner(model)
    vllm_config = SimpleNamespace(parallel_config=None, model_config=SimpleNamespace(hf_config=None))
    w.weight_transfer_engine = StrategyTransferEngine(None, vllm_config, torch.device("cpu"), model)
    return w


def test_tp_worker_reports_the_full_tensors_it_loaded(monkeypatch) -> None:
    """A shard's resident sums differ from the full tensor's; a TP worker reports what its loader consumed."""
    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    shard = torch.nn.Linear(3, 2, bias=False)  # rank 1's half of the rows: a ColumnParallelLinear shard
    with torch.no_grad():
        shard.weight.copy_(full[2:])
    model = torch.nn.Module()
    model.proj = shard
    w = _worker(model)
    w.weight_transfer_engine.loaded_checksums = group_checksums([("proj.weight", full)])
    w.weight_transfer_engine.version = 5
    monkeypatch.setattr(base, "tp_position", lambda: (1, 2))
    rep = w.weight_checksums()
    assert rep["verified_on"] == "load" and rep["tp_rank"] == 1 and rep["version"] == 5
    assert rep["groups"] == {"proj": [66.0, 506.0, 12.0]}  # 0+1+...+11 = 66; 0^2+...+11^2 = 506
    monkeypatch.setattr(base, "tp_position", lambda: (0, 1))
    resident = w.weight_checksums()
    assert resident["verified_on"] == "resident"
    assert resident["groups"] == {"proj": [6.0 + 7 + 8 + 9 + 10 + 11, 36.0 + 49 + 64 + 81 + 100 + 121, 6.0]}


def test_tp_worker_joins_the_sync_group_at_base_rank_plus_tp_rank(monkeypatch) -> None:
    joined = []
    monkeypatch.setattr(collective.collective_group, "join_group", lambda *a: joined.append(a))
    monkeypatch.setattr(base, "tp_position", lambda: (1, 2))
    w = _worker(torch.nn.Linear(2, 2))
    info = {"backend": "gloo", "world_size": 5, "group": "g", "timeout_s": 10.0, "layout": [], "bucket_mb": 64.0,
            "tensor_parallel_size": 2}
    w.weight_transfer_engine.init_transfer_engine(StrategyInitInfo("nccl", info, 1))  # engine 1 of 2, TP 2: ranks 3, 4
    assert joined == [("gloo", 5, 4, "g", 10.0)]
    assert w.weight_transfer_engine.receivers["nccl"].group == ("g", [], 64.0, "cpu")


def test_tp_position_outside_vllm_workers_is_rank_zero_of_one() -> None:
    assert base.tp_position() == (0, 1)
