"""Weight sync strategies end to end on CPU: a trainer actor, two vLLM engines (tiny model), Ray local.

Every strategy must leave each engine holding the trainer's weights bit for bit (SHA-256 of every tensor
the engine loaded against the trainer's), across real optimizer steps; deltas must survive a missed
version and tied embeddings; verification must catch a corrupted bucket; a peer that never joins a
broadcast must end in an error, not a hang. (A whole run synced by the gloo broadcast: tests/integration/
test_grpo_tiny.py.)
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import ray
import torch

from actors.rollout.worker import RolloutWorkerActor
from actors.trainer.trainer import TrainerActor
from orchestrator.algo import TrainBatch
from orchestrator.config import load_config
from orchestrator.weight_sync import WeightMismatchError
from orchestrator.weight_sync.syncer import make_syncer
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD_OVERRIDE = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"  # tests/gpu


def _cfg(tiny_model: Path, out: Path, *extra: str):
    return load_config("configs/grpo_arith_cpu.yaml",
                       tiny_overrides(tiny_model, out) + ["rollout.num_workers=2", "weight_sync.timeout_s=120", *extra])


def _start(cfg, tiny_model: Path):
    trainer = TrainerActor.options(num_cpus=0.5).remote(str(tiny_model), cfg.trainer, cfg.algo, 1.0, 12, 0)
    engines = [RolloutWorkerActor.options(num_cpus=0.5).remote(str(tiny_model), cfg.rollout, k) for k in range(2)]
    ray.get([a.ready.remote() for a in [trainer, *engines]])
    ray.get([e.extension_call.remote("record_digests", True) for e in engines])
    return trainer, engines


def _train_once(trainer, seed: int) -> None:
    """One real optimizer step on a small fake batch: the weights move as in a run."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 500, (6,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(5, 500, (5,), generator=g).tolist() for _ in range(4)]
    batch = TrainBatch.with_sequence_advantages(prompts, responses, [[-1.0] * 5] * 4, [1.0, -1.0, 0.5, -0.5])
    ray.get(trainer.train_step.remote(batch))


def _trainer_digests(trainer, dtype: str) -> dict:
    named, _ = ray.get(trainer.weights_for_sync.options(num_returns=2).remote(dtype))
    return {n: hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for n, t in named}


def _assert_bit_exact(trainer, engines, dtype: str, ids=(0, 1)) -> None:
    want = _trainer_digests(trainer, dtype)
    for i in ids:
        got = ray.get(engines[i].extension_call.remote("loaded_digests"))
        assert got.keys() == want.keys()
        differing = [n for n in want if got[n] != want[n]]
        assert not differing, f"engine {i} differs from the trainer in {differing[:3]}"


def _sync_versions_bit_exact(syncer, trainer, engines, versions) -> list[dict]:
    """Syncs each version (an optimizer step before every one but the first), each verified and bit-exact on
    every engine, which then reports that version; returns each sync's metrics."""
    synced = []
    for version in versions:
        if version > versions[0]:
            _train_once(trainer, version)
        metrics = syncer.sync(version)
        _assert_bit_exact(trainer, engines, "float32")
        assert [ray.get(e.checksums.remote())["version"] for e in engines] == [version] * len(engines)
        assert metrics["sync/version"] == version
        synced.append(metrics)
    return synced


def _kill(*actors) -> None:
    for a in actors:
        ray.kill(a)


def _check_a_corrupted_bucket_is_caught(syncer, engines, version: int) -> None:
    """Verification catches a corrupted load on engine 1; weight_sync.retries redoes a failed verification (here
    engine 0's) and counts it."""
    ray.get(engines[1].extension_call.remote("inject_fault_next_load"))
    with pytest.raises(WeightMismatchError, match="rollout worker 1: tensor group '(lm_head|model.embed_tokens)'"):
        syncer.sync(version)
    ray.get(engines[0].extension_call.remote("inject_fault_next_load"))
    assert syncer.sync_with_retries(version, retries=1)["sync/failures"] == 1
    assert [ray.get(e.checksums.remote())["version"] for e in engines] == [version, version]


def _check_engines_leave_and_join(syncer, trainer, engines, version: int) -> None:
    """placement.elastic's per-engine path (docs/elastic.md): engine 0 leaves (engine 1 takes index 0, its version
    forgotten), a version is synced to the one left, engine 0 joins again at index 1 (connected, synced alone on that
    version, verified); the same with their roles swapped, which restores the order. Both bit-exact each time."""
    for v, leaving in ((version, engines[0]), (version + 1, engines[1])):
        _train_once(trainer, v)
        syncer.remove_engine(0)
        assert len(syncer.engines) == 1 and syncer.engines[0] is not leaving
        assert syncer.sync(v)["sync/version"] == v
        syncer.add_engine(leaving, v)
        assert syncer.engines[1] is leaving
        _assert_bit_exact(trainer, engines, "float32")
        assert [ray.get(e.checksums.remote())["version"] for e in engines] == [v, v]
    assert syncer.engines == list(engines)


def _check_a_broadcast_without_receivers_times_out(trainer, version: int) -> None:
    """A peer that never joins a broadcast ends in an error naming the timeout (weight_sync.timeout_s=5), not a
    hang. Last: the collective group is broken afterwards."""
    with pytest.raises((TimeoutError, ray.exceptions.RayTaskError), match="weight_sync.timeout_s|[Tt]imed out"):
        _, meta = trainer.weight_sync.options(num_returns=2).remote("nccl", "send", version, {0: 1, 1: 1})
        ray.get(meta, timeout=60)  # the engines never call receive


def _check_delta_above_threshold_sends_full(tiny_model: Path, out: Path, trainer, engines, version: int) -> None:
    """A delta syncer set up again on the same actors with weight_sync.delta.max_changed_fraction=0.01: its first
    sync is full (no base yet); after an fp32 Adam step nearly every element changed, so the next is full too."""
    cfg = _cfg(tiny_model, out, "weight_sync.strategy=delta", "weight_sync.delta.max_changed_fraction=0.01")
    syncer = make_syncer(cfg, trainer, engines)
    assert syncer.sync(version)["sync/delta_engines"] == 0
    _train_once(trainer, version + 1)
    m = syncer.sync(version + 1)
    assert m["sync/changed_fraction"] > 0.5 and m["sync/delta_engines"] == 0
    _assert_bit_exact(trainer, engines, "float32")


# One trainer and two engines serve every check of object_store, disk and delta, one strategy after the other (each
# bit-exact across three versions on engines the previous strategy synced; before, each started its own actors);
# then (disk) a corrupted bucket caught and retried, (delta) a syncer whose threshold the changes pass sending full
# weights, (disk, delta) engines leaving and joining the syncer as placement.elastic makes them. nccl (gloo on CPU) gets actors of its own: its collective group ends broken by the last check, a
# broadcast nobody receives timing out, after a corrupted bucket caught and retried. rollout.engine=async_llm (vLLM's
# AsyncLLM, its engine core in a process of its own: the payloads cross into it) takes object_store and disk, then
# its second engine's core is killed: the actor ends with it.
@pytest.mark.parametrize("strategies,engine", [(("object_store", "disk", "delta"), "in_process"), (("nccl",), "in_process"),
                                               (("object_store", "disk"), "async_llm")], ids=["shared", "nccl", "async_llm"])
def test_strategy_leaves_engines_bit_exact_across_steps(ray_local, tiny_model, tmp_path, strategies, engine):
    timeout = ["weight_sync.timeout_s=5"] if "nccl" in strategies else []  # for the broadcast nobody receives
    over = [*timeout, f"rollout.engine={engine}", f"weight_sync.strategy={strategies[0]}"]
    trainer, engines = _start(_cfg(tiny_model, tmp_path, *over), tiny_model)
    try:
        first = 1
        for strategy in strategies:
            cfg = _cfg(tiny_model, tmp_path, f"weight_sync.strategy={strategy}", "weight_sync.bucket_mb=1",
                       "weight_sync.delta.max_changed_fraction=1.0", *over[:-1])
            first = _check_strategy(cfg, strategy, tiny_model, tmp_path, trainer, engines, first)
        if engine == "async_llm":
            _check_the_actor_ends_with_its_engine_core(engines[1])
    finally:
        _kill(trainer, *engines)


def _check_the_actor_ends_with_its_engine_core(worker) -> None:
    """rollout.engine=async_llm (docs/faults.md): the engine core, a process of its own, SIGKILLed on its own; the
    rollout worker's actor ends its process within seconds, so Ray reports it as died and the job's recovery of a
    lost worker takes over (tests/integration/test_rollout_restart.py: that path; a call in flight into the dead
    core: tests/integration/test_async_llm_engine.py). Before: a test with an engine of its own."""
    import os
    import signal
    import time

    from tests.integration.helpers import engine_cores

    cores = engine_cores(ray.get(worker.pid.remote()))
    assert len(cores) == 1, cores
    os.kill(cores[0], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() - t0 < 60:
            ray.get(worker.ready.remote(), timeout=60)
            time.sleep(0.2)
    assert time.monotonic() - t0 < 30


def _check_strategy(cfg, strategy: str, tiny_model: Path, out: Path, trainer, engines, first: int) -> int:
    """Versions first..first+2 synced bit-exact by `strategy`, then its own checks; returns the next free version."""
    syncer = make_syncer(cfg, trainer, engines)
    versions = (first, first + 1, first + 2)
    synced = _sync_versions_bit_exact(syncer, trainer, engines, versions)
    assert all(m["sync/seconds"] > 0 for m in synced)
    metrics, after = synced[-1], first + 3
    if strategy == "nccl":
        assert metrics["sync/buckets"] >= 3  # 1 MiB buckets: the broadcast really was bucketed
    if strategy == "disk":
        left = sorted(p.name for p in Path(cfg.weight_sync.disk.path).iterdir())
        assert left == [f"v{versions[-1]}"], f"old versions or temporary folders left behind: {left}"
    if strategy == "delta":
        assert metrics["sync/delta_engines"] == 2 and 0 < metrics["sync/delta_ratio"] <= 1.2
        _check_delta_above_threshold_sends_full(tiny_model, out, trainer, engines, after)
        after += 2
    if strategy in ("nccl", "disk"):
        _check_a_corrupted_bucket_is_caught(syncer, engines, after)
        after += 1
    if strategy in ("disk", "delta"):  # object_store's join and leave: tests/integration/test_elastic_engines.py
        _check_engines_leave_and_join(syncer, trainer, engines, after)
        after += 2
    if strategy == "nccl":
        _check_a_broadcast_without_receivers_times_out(trainer, after)
        after += 1
    return after


def test_delta_missed_version_falls_back_to_full_in_bf16_with_tied_embeddings(ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "weight_sync.strategy=delta", "rollout.dtype=bfloat16",
               "weight_sync.delta.max_changed_fraction=1.0")
    trainer, engines = _start(cfg, tiny_model)
    try:
        syncer = make_syncer(cfg, trainer, engines)
        first = syncer.sync(1)
        assert first["sync/delta_engines"] == 0  # no base version yet: full
        _train_once(trainer, 2)
        second = syncer.sync(2)
        assert second["sync/delta_engines"] == 2 and second["sync/bytes"] < second["sync/bytes_full"]
        _assert_bit_exact(trainer, engines, "bfloat16")
        _train_once(trainer, 3)
        syncer.sync(3, engine_ids=[0])  # engine 1 misses version 3
        _train_once(trainer, 4)
        fourth = syncer.sync(4)
        assert fourth["sync/delta_engines"] == 1  # engine 0 by delta, engine 1 by a full sync
        _assert_bit_exact(trainer, engines, "bfloat16")
        # the tied output head is verified too: it is re-tied to the new embedding on the engine
        checks = ray.get(engines[1].checksums.remote())
        assert "lm_head" in checks["groups"] and checks["shadow_version"] == 4
    finally:
        _kill(trainer, *engines)
