"""The sharded (DCP) part of an FSDP2 checkpoint is read with safe loaders only (orchestrator/checkpoint/dcp.py):
a real DCP save of model + AdamW loads back exactly; a `.metadata` or a non-tensor item that would build
another object (here `os.system`) is refused naming the file or the item."""
from __future__ import annotations

import io
import os
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from orchestrator.checkpoint import CheckpointError
from orchestrator.checkpoint.dcp import SafeLoadPlanner, SafeReader


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def _state(model, opt) -> dict:
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)}


@pytest.fixture
def saved(tmp_path):
    model, opt = _model_and_optimizer(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process, as a single trainer
        dcp.save(_state(model, opt), checkpoint_id=str(tmp_path / "sharded"))
    return tmp_path / "sharded", model, opt


def _safe_load(folder, state):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner())


def test_a_dcp_checkpoint_loads_back_exactly_with_the_safe_reader(saved):
    folder, model, opt = saved
    other, other_opt = _model_and_optimizer(1)
    state = _state(other, other_opt)
    _safe_load(folder, state)
    for k, v in _state(model, opt)["model"].items():
        assert torch.equal(state["model"][k], v)
    want = _state(model, opt)["optimizer"]
    assert torch.equal(state["optimizer"]["state"]["0.weight"]["exp_avg"], want["state"]["0.weight"]["exp_avg"])
    assert state["optimizer"]["param_groups"][0]["lr"] == 1e-3  # a non-tensor item, read by torch.load(weights_only=True)


class _Evil:
    def __reduce__(self):
        return os.system, ("echo pwned",)


def test_crafted_metadata_is_refused_naming_the_file(saved):
    folder, model, opt = saved
    (folder / ".metadata").write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused by the safe DCP metadata reader: .*system"):
        SafeReader(str(folder)).read_metadata()


def test_crafted_non_tensor_item_is_refused():
    class Item:  # the planner reads only read_item.dest_index.fqn
        class dest_index:
            fqn = "optimizer.param_groups.0.lr"
    planner = SafeLoadPlanner()
    with pytest.raises(CheckpointError, match="optimizer.param_groups.0.lr: refused by the safe loader"):
        buf = io.BytesIO()
        torch.save(_Evil(), buf)
        buf.seek(0)
        planner.load_bytes(Item, buf)
