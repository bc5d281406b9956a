"""actors/weight_sync/transfer_engine.py: our strategies' receivers behind vLLM's weight-transfer protocol.

vLLM's worker builds the engine from `weight_transfer_config` through its factory and calls init / start / update /
finish on it; the integration tests (test_weight_sync, test_partial_rollout) run it inside real engines. Here: the
factory builds it by name, the protocol's order and what a load records, and the fault hooks, on a small model
whose `load_weights` is vLLM's contract (vLLM's layerwise reload needs vLLM layers, so it is replaced here)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import vllm.model_executor.model_loader.reload as reload
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from actors.rollout.vllm_engine import TRANSFER_BACKEND, engine_kwargs
from actors.weight_sync import transfer_engine
from actors.weight_sync.transfer_engine import BACKEND, NO_VERSION, StrategyInitInfo, StrategyTransferEngine
from orchestrator.weight_sync.checksum import group_checksums


class Model(torch.nn.Module):
    """Two linear layers; `load_weights` copies (name, tensor) pairs in, as a vLLM model's does."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 2, bias=False)
        self.calls: list[str] = []

    def load_weights(self, weights):
        loaded = set()
        for name, t in weights:
            self.get_parameter(name).data.copy_(t)
            loaded.add(name)
        return loaded


@pytest.fixture
def engine(monkeypatch):
    model = Model()
    monkeypatch.setattr(reload, "initialize_layerwise_reload", lambda m: m.calls.append("initialize"))
    monkeypatch.setattr(reload, "finalize_layerwise_reload", lambda m, c: m.calls.append("finalize"))
    vllm_config = SimpleNamespace(parallel_config=None,
                                  model_config=SimpleNamespace(hf_config=SimpleNamespace(tie_word_embeddings=False)))
    return WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=BACKEND), vllm_config,
                                                     torch.device("cpu"), model)


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("a.weight", torch.randn(2, 3, generator=g)), ("a.bias", torch.randn(2, generator=g)),
            ("b.weight", torch.randn(2, 2, generator=g))]


def load(engine, payload, version: int, strategy: str = "object_store") -> None:
    engine.start_weight_update()
    engine.update_weights({"strategy": strategy, "payload": payload, "version": version})
    engine.finish_weight_update()


def test_vllm_builds_our_engine_by_the_name_the_rollout_engine_configures(engine):
    assert isinstance(engine, StrategyTransferEngine)
    assert TRANSFER_BACKEND == BACKEND
    cfg = SimpleNamespace(dtype="float32", enforce_eager=True, enable_prefix_caching=True, max_model_len=256,
                          kv_cache_space_gib=1, gpu_memory_utilization=0.5)
    assert engine_kwargs("m", cfg)["weight_transfer_config"] == {"backend": BACKEND}
    transfer_engine.register()  # importing twice in one process (in-process engines) is harmless


def test_a_load_runs_vllms_reload_and_records_its_version_and_checksums_at_finish(engine):
    sent = weights(1)
    engine.start_weight_update()
    engine.update_weights({"strategy": "object_store", "payload": sent, "version": 4})
    assert engine.version == 0 and engine.loaded_checksums == {}  # nothing is committed before finish
    engine.finish_weight_update()
    assert engine.model.calls == ["initialize", "finalize"]
    assert engine.version == 4 and engine.loaded_checksums == group_checksums(sent)
    assert torch.equal(engine.model.a.weight, sent[0][1]) and torch.equal(engine.model.b.weight, sent[2][1])
    assert list(engine.receivers) == ["object_store"]  # made at first use: object_store needs no connect


def test_an_update_outside_a_start_is_refused_and_a_failed_stream_commits_nothing(engine, tmp_path):
    with pytest.raises(RuntimeError, match="update_weights before start_weight_update"):
        engine.update_weights({"strategy": "object_store", "payload": weights(1), "version": 1})
    load(engine, weights(1), 1)
    engine.start_weight_update()
    with pytest.raises(FileNotFoundError):  # a disk payload whose folder is gone
        engine.update_weights({"strategy": "disk", "payload": str(tmp_path / "v2"), "version": 2})
    # vLLM's worker ends the update without a finish: the engine finalized the reload itself (no meta layers left)
    assert engine.model.calls[-2:] == ["initialize", "finalize"]
    # the model may hold a mix of versions now: it claims none, so the syncer sends it full weights
    assert engine.version == NO_VERSION and engine.loaded_checksums == {}
    load(engine, weights(2), 2)  # the next update starts cleanly
    assert engine.version == 2 and engine.loaded_checksums == group_checksums(weights(2))


def test_an_error_in_finish_is_kept_for_the_caller_and_never_raised_into_vllms_worker(engine, monkeypatch):
    load(engine, weights(1), 1)

    def broken(model, config):
        raise RuntimeError("repacking failed")

    monkeypatch.setattr(reload, "finalize_layerwise_reload", broken)
    engine.start_weight_update()
    engine.update_weights({"strategy": "object_store", "payload": weights(2), "version": 2})
    engine.finish_weight_update()  # returns: vLLM's worker leaves the update and takes the next one
    assert engine.version == NO_VERSION and engine.loaded_checksums == {}
    assert str(engine.take_finish_error()) == "repacking failed" and engine.take_finish_error() is None


def test_init_connects_a_fresh_receiver_and_shutdown_drops_them(engine, monkeypatch):
    connected = []
    from actors.weight_sync import collective

    monkeypatch.setattr(collective.collective_group, "join_group", lambda *a: connected.append(a))
    info = {"backend": "gloo", "world_size": 2, "group": "g", "timeout_s": 5.0, "layout": [], "bucket_mb": 1.0,
            "tensor_parallel_size": 1}
    engine.init_transfer_engine(engine.parse_init_info({"strategy": "nccl", "info": info, "engine_index": 0}))
    first = engine.receivers["nccl"]
    engine.init_transfer_engine(StrategyInitInfo("nccl", info, 0))  # a new syncer: a new receiver and group
    assert engine.receivers["nccl"] is not first and len(connected) == 2
    engine.shutdown()
    assert engine.receivers == {}
    with pytest.raises(ValueError, match="Invalid init_info"):
        engine.parse_init_info({"strategy": "nccl", "bogus": 1})


def test_fault_hooks_act_on_the_next_load_only(engine, monkeypatch):
    engine.digests = {}
    engine.faults.corrupt_first = True
    load(engine, weights(1), 1)
    assert engine.loaded_checksums != group_checksums(weights(1))  # what was loaded is what is reported
    assert set(engine.digests) == {"a.weight", "a.bias", "b.weight"}
    load(engine, weights(2), 2)
    assert engine.loaded_checksums == group_checksums(weights(2))
    scaled = []
    monkeypatch.setattr(transfer_engine, "corrupt_resident_weights", lambda model, scale: scaled.append(scale))
    engine.faults.scale_after = 1.5
    load(engine, weights(3), 3)
    load(engine, weights(4), 4)
    assert scaled == [1.5]
