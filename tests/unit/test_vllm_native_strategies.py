"""weight_sync.strategy=vllm_nccl and vllm_ipc (actors/weight_sync/vllm_nccl.py, vllm_ipc.py) on CPU: vLLM's own engines
receive inside our transfer engine, with what needs CUDA replaced: for nccl, vLLM's PyNccl group and packed broadcast
by an in-memory wire that cuts the weights into chunks as the packed consumer does; for ipc, the CUDA handles by
handles to CPU tensors. What runs for real: vLLM's `NCCLWeightTransferEngine` and `IPCWeightTransferEngine` (their
init info, update info and receive paths), our receivers' wiring of ranks, layout and payload, and the checksums,
digests and version of what they loaded. The GPU tests (tests/gpu/test_weight_sync_gpu.py) run the real wire."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import vllm.distributed.weight_transfer.ipc_engine as ipc_engine
import vllm.distributed.weight_transfer.nccl_engine as nccl_engine
import vllm.model_executor.model_loader.reload as reload
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from actors.weight_sync import vllm_ipc, vllm_nccl
from actors.weight_sync.base import SyncContext
from actors.weight_sync.transfer_engine import BACKEND, StrategyInitInfo
from orchestrator.weight_sync.buckets import tensor_specs
from orchestrator.weight_sync.checksum import group_checksums
from orchestrator.weight_sync.registry import get


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 2, bias=False)

    def load_weights(self, weights):
        for name, t in weights:
            self.get_parameter(name).data.copy_(t)


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("a.weight", torch.randn(2, 3, generator=g)), ("a.bias", torch.randn(2, generator=g)),
            ("b.weight", torch.randn(2, 2, generator=g))]


@pytest.fixture
def wire(monkeypatch):
    """The group joins and the packed broadcast, in memory: `wire["sent"]` is what the trainer put on it."""
    state = {"joined": [], "sent": None}

    def join(init_info, parallel_config):
        state["joined"].append(init_info)
        return SimpleNamespace(destroy=lambda: state.__setitem__("destroyed", True))

    def consume(iterator, group, src, post_unpack_func, buffer_size_bytes, num_buffers, device):
        expected = list(iterator)  # (name, (shape, dtype)) from the update info, as the real consumer reads it
        sent = state["sent"]
        assert [(n, list(s), d) for n, (s, d) in expected] == [(n, list(t.shape), t.dtype) for n, t in sent]
        state["buffer"] = (buffer_size_bytes, num_buffers)
        for k in range(0, len(sent), 2):  # chunks of two tensors, as the packed consumer unpacks them
            post_unpack_func([(n, t.clone()) for n, t in sent[k:k + 2]])

    monkeypatch.setattr(nccl_engine, "worker_init_process_group", join)
    monkeypatch.setattr(nccl_engine, "packed_nccl_broadcast_consumer", consume)
    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda m: None)
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda m, c: None)
    return state


def make_engine():
    vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=0, world_size=1, rank=0),
                                  model_config=SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=False)))
    return WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=BACKEND), vllm_config,
                                                     torch.device("cpu"), Model())


def info(engines: int = 2, tp: int = 2) -> dict:
    return {"master_address": "10.0.0.1", "master_port": 29555, "world_size": 1 + engines * tp,
            "tensor_parallel_size": tp, "layout": tensor_specs(weights(0)), "buffer_bytes": 8 << 20, "num_buffers": 2}


def test_vllms_engine_joins_at_the_engines_rank_and_loads_through_our_checks(wire):
    engine = make_engine()
    engine.digests = {}
    engine.init_transfer_engine(StrategyInitInfo(get("vllm_nccl"), info(), 1))  # engine 1 of 2, TP 2
    (joined,) = wire["joined"]
    assert (joined.rank_offset, joined.world_size, joined.master_address, joined.master_port) == (3, 5, "10.0.0.1",
                                                                                                   29555)
    assert joined.packed and joined.packed_buffer_size_bytes == 8 << 20  # vLLM adds the worker's own TP rank
    receiver = engine.receivers["vllm_nccl"]
    assert isinstance(receiver.native, nccl_engine.NCCLWeightTransferEngine)
    for version in (1, 2):
        wire["sent"] = weights(version)
        engine.start_weight_update()
        engine.update_weights({"strategy": "vllm_nccl", "payload": None, "version": version})
        engine.finish_weight_update()
        assert engine.version == version and engine.loaded_checksums == group_checksums(weights(version))
        assert torch.equal(engine.model.b.weight, weights(version)[2][1]) and len(engine.digests) == 3
    assert wire["buffer"] == (8 << 20, 2)
    engine.shutdown()
    assert wire["destroyed"] and engine.receivers == {}


def test_a_corrupted_chunk_is_what_the_checksums_report(wire):
    engine = make_engine()
    engine.init_transfer_engine(StrategyInitInfo("vllm_nccl", info(1, 1), 0))
    assert wire["joined"][0].rank_offset == 1
    wire["sent"] = weights(1)
    engine.faults.corrupt_first = True
    engine.start_weight_update()
    engine.update_weights({"strategy": "vllm_nccl", "payload": None, "version": 1})
    engine.finish_weight_update()
    assert engine.loaded_checksums != group_checksums(weights(1))


def test_the_sender_refuses_cpu_and_a_layout_the_engines_were_not_told():
    sender = vllm_nccl.VLLMNcclSender(lambda device: (weights(1), {}))
    with pytest.raises(RuntimeError, match="vllm_nccl needs CUDA GPUs.*use nccl \\(gloo on CPU\\), disk"):
        sender.setup(SyncContext(engines=1, tensor_parallel_size=1, timeout_s=5.0, dtype="float32",
                                 options={"bucket_mb": 8}))
    layout = tensor_specs(weights(1))
    vllm_nccl.check_against_layout(weights(2), layout)
    with pytest.raises(ValueError, match="tensor 2 is 'b.weight' \\(2, 2\\) torch.float16, the engines expect "
                                         "'b.weight' \\(2, 2\\) torch.float32"):
        vllm_nccl.check_against_layout(weights(2)[:2] + [("b.weight", torch.zeros(2, 2, dtype=torch.float16))], layout)
    with pytest.raises(ValueError, match="sends 2 tensors, the engines expect 3"):
        vllm_nccl.check_against_layout(weights(2)[:2], layout)


def test_a_chunk_outside_an_update_and_a_receive_before_connect_are_refused():
    receiver = vllm_nccl.VLLMNcclReceiver()
    with pytest.raises(RuntimeError, match="outside an update"):
        receiver.loader.load_weights([])
    with pytest.raises(RuntimeError, match="before connect"):
        receiver.receive(None, 1, lambda pairs: None)
    with pytest.raises(RuntimeError, match="nccl engine\\): connect before attach"):
        receiver.connect(info(), 0)


@pytest.fixture
def cpu_ipc(monkeypatch):
    """CUDA IPC on CPU: a "handle" is the tensor itself, rebuilt as a clone on the engine's side."""
    props = SimpleNamespace(uuid="GPU-0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(torch.multiprocessing.reductions, "reduce_tensor", lambda t: (None, (t,) + (0,) * 7))
    monkeypatch.setattr(ipc_engine, "rebuild_cuda_tensor", lambda t, *rest: t.clone())
    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda m: None)
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda m, c: None)


def test_ipc_the_engines_rebuild_the_trainers_copies_and_load_them_through_our_checks(cpu_ipc):
    trainer_weights = weights(1)
    sender = vllm_ipc.VLLMIpcSender(lambda device: (trainer_weights, {"groups": group_checksums(trainer_weights)}))
    payload, meta = sender.send(1, {0: None})
    assert payload["names"] == ["a.weight", "a.bias", "b.weight"] and payload["dtype_names"][0] == "float32"
    shared = payload["ipc_handles"][0]["GPU-0"][0]
    assert torch.equal(shared, trainer_weights[0][1]) and shared.data_ptr() != trainer_weights[0][1].data_ptr()
    engine = make_engine()
    engine.init_transfer_engine(StrategyInitInfo("vllm_ipc", {}, 0))
    assert isinstance(engine.receivers["vllm_ipc"].native, ipc_engine.IPCWeightTransferEngine)
    engine.start_weight_update()
    engine.update_weights({"strategy": "vllm_ipc", "payload": payload, "version": 1})
    engine.finish_weight_update()
    assert engine.version == 1 and engine.loaded_checksums == meta["groups"]
    assert torch.equal(engine.model.a.weight, trainer_weights[0][1])
    sender.send(2, {0: 1})
    assert sorted(sender.held) == [1, 2]  # each version's copies live until the engines were verified on it
    sender.after_verified(2)
    assert sender.held == {}


def test_vllm_engines_refuse_placements_they_cannot_serve():
    from orchestrator.config import load_config
    from orchestrator.config.load import ConfigError

    with pytest.raises(RuntimeError, match="vllm_ipc needs CUDA GPUs shared by the trainer"):
        vllm_ipc.VLLMIpcSender(lambda device: (weights(1), {})).setup(
            SyncContext(engines=1, tensor_parallel_size=1, timeout_s=5.0, dtype="float32"))
    with pytest.raises(ConfigError, match="weight_sync.strategy=vllm_ipc works with placement.mode in \\['colocated'\\] "
                                          "\\(got placement.mode=disaggregated\\)"):
        load_config(None, ["weight_sync.strategy=vllm_ipc", "rollout.num_workers=1"])
    with pytest.raises(ConfigError, match="vllm_ipc serves at most 1 engine GPU.*tensor_parallel_size = 2"):
        load_config(None, ["weight_sync.strategy=vllm_ipc", "placement.mode=colocated", "rollout.num_workers=2"])
    cfg = load_config(None, ["weight_sync.strategy=vllm_ipc", "placement.mode=colocated", "rollout.num_workers=1"])
    assert cfg.weight_sync.strategy == "vllm_ipc"
    with pytest.raises(ConfigError, match="vllm_nccl works with placement.mode in .*got placement.mode=colocated"):
        load_config(None, ["weight_sync.strategy=vllm_nccl", "placement.mode=colocated"])


def test_a_failed_chunk_load_receives_the_rest_of_the_broadcast_then_raises(wire):
    """A chunk whose load raises does not stop vLLM's engine mid-broadcast (on GPUs the trainer and the other engines
    would wait on this one until weight_sync.timeout_s): the chunks after it are received and dropped, the error is
    raised after the transfer, and the next update loads normally."""
    engine = make_engine()
    engine.init_transfer_engine(StrategyInitInfo("vllm_nccl", info(1, 1), 0))
    seen, model_load = [], engine.model.load_weights

    def fail_first(chunk):
        chunk = list(chunk)
        seen.append([n for n, _ in chunk])
        if len(seen) == 1:
            raise ValueError("shape mismatch in a.weight")
        return model_load(chunk)

    engine.model.load_weights = fail_first
    wire["sent"] = weights(1)
    engine.start_weight_update()
    with pytest.raises(ValueError, match="shape mismatch") as err:
        engine.update_weights({"strategy": "vllm_nccl", "payload": None, "version": 1})
    assert "received and dropped (1 chunks after the one that failed)" in "".join(err.value.__notes__)
    assert seen == [["a.weight", "a.bias"]]  # the second chunk was received (the wire went on) and not loaded
    engine.finish_weight_update()
    wire["sent"] = weights(2)
    engine.start_weight_update()
    engine.update_weights({"strategy": "vllm_nccl", "payload": None, "version": 2})
    engine.finish_weight_update()
    assert engine.version == 2 and engine.loaded_checksums == group_checksums(weights(2))
