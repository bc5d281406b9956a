"""FSDP2 and torch.distributed.checkpoint helpers of the sharded trainer ranks (actors/trainer/sharded.py):
the process group, sharding, the full-state-dict gather and the sharded / unsharded checkpoint I/O.

`load_sharded` also loads a sharded checkpoint into a single trainer (actors/trainer/trainer.py), so it
lives here, below both trainers, and neither imports the other's module for it.
"""
from __future__ import annotations

import datetime
import time
import warnings
from pathlib import Path

import ray
import ray.experimental.internal_kv as internal_kv
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from actors.model import lora
from orchestrator.checkpoint.dcp import SafeLoadPlanner, SafeReader
from orchestrator.checkpoint.state import load_trainer_state
from orchestrator.utils.net import free_port

SHARDED_DIR = "sharded"  # DCP files of model + optimizer inside a checkpoint folder
FULL_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)


def init_group(rank: int, world_size: int, group_name: str, timeout_s: float) -> str:
    """Join torch's default process group as `rank` of `world_size`; returns the backend used.

    Rank 0 publishes `<node ip>:<free port>` under `rl_orch_fsdp_<group_name>` in Ray's internal KV; the
    other ranks wait for it up to `timeout_s` seconds. Backend: "nccl" with CUDA, else "gloo".
    Raises TimeoutError when rank 0's address does not appear in time; torch raises when a rank does
    not join within `timeout_s`.
    """
    key = f"rl_orch_fsdp_{group_name}"
    if rank == 0:
        address = f"{ray.util.get_node_ip_address()}:{free_port()}"
        internal_kv._internal_kv_put(key, address, overwrite=True)
    else:
        deadline = time.monotonic() + timeout_s
        while (value := internal_kv._internal_kv_get(key)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"trainer rank {rank}: rank 0 did not publish its address ({key}) in {timeout_s:g}s")
            time.sleep(0.05)
        address = value.decode()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return backend


def join_group(rank: int, world_size: int, group_name: str, timeout_s: float) -> str:
    """`init_group`, then rank 0 deletes the rendezvous key (every rank has joined). A process already in a
    default group (torchrun, a test's `torch.multiprocessing.spawn`) keeps it. Returns the backend. Raises as
    `init_group`, and RuntimeError when the existing group's rank or size differs from `rank` / `world_size`."""
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise RuntimeError(f"rank {rank} of {world_size}: this process is already rank {dist.get_rank()} of "
                               f"a group of {dist.get_world_size()}")
        return dist.get_backend()
    backend = init_group(rank, world_size, group_name, timeout_s)
    if rank == 0:
        internal_kv._internal_kv_del(f"rl_orch_fsdp_{group_name}")
    return backend


def shard_model(model: torch.nn.Module, world_size: int) -> torch.nn.Module:
    """`fully_shard` every decoder layer (classes named in the HF model's `_no_split_modules`), then the
    root, over a 1-D mesh of `world_size` ranks on the model's device type. Modifies `model` in place
    (its parameters become sharded DTensors) and returns it. Needs an initialised process group."""
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (world_size,))
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the rest (embeddings, final norm, a tied or untied head) in one unit
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full, unsharded state dict (HF names, CPU tensors) on rank 0, {} on other ranks.
    Every rank of the group must call it at the same time."""
    return get_model_state_dict(model, options=FULL_CPU)


def save_sharded(model, optimizer, folder: Path) -> None:
    """Collective: DCP save of model + optimizer (sharded) into `folder` (one file per rank + metadata)."""
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=str(folder))


def load_sharded(model, optimizer, folder: Path) -> None:
    """Collective: DCP load of `save_sharded`'s files into the current sharding (any D; DCP reshards), read
    with safe loaders only (orchestrator/checkpoint/dcp.py). Without a process group (a single trainer,
    `Trainer.load_checkpoint`) it loads in this process."""
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": intended for a single trainer
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner())  # no unsafe unpickling
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_unsharded(model, optimizer, folder: Path, peft_model=None) -> None:
    """Collective: load a single trainer's checkpoint (`policy/` + `trainer_state.pt`'s optimizer state,
    keyed by parameter index) into the sharded model and optimizer. With LoRA (`peft_model` given) the
    weights are the adapter in `policy_adapter/` (the base weights stay `model.path`'s; `policy/` holds
    merged weights); raises as `actors.model.lora.load_adapter` when it is missing or does not match."""
    if peft_model is not None:
        src = lora.adapter_tensors(peft_model, model, folder / lora.ADAPTER_DIR)
    else:
        lora.check_no_adapter(folder)
        src = AutoModelForCausalLM.from_pretrained(folder / "policy", dtype=torch.float32).state_dict()
    plain = load_trainer_state(folder / "trainer_state.pt")["optimizer"]  # weights_only=True
    load_full_state(model, optimizer, src, plain)


def load_full_state(model, optimizer, weights: dict[str, torch.Tensor], plain: dict) -> None:
    """Collective: full weights (state-dict names; missing keys keep their values) and a single process's
    optimizer state dict (`optimizer.state_dict()`, keyed by parameter index) into the sharded model and
    optimizer. The PPO critic's unsharded checkpoints load through it too (actors/critic_sharded.py)."""
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's parameter order
    by_name = {"state": {names[i]: s for i, s in plain["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in plain["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
