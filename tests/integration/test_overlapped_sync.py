"""Overlapped weight syncs (weight_sync.overlap) on real actors: the tiny model, a trainer and two vLLM engines.

The trainer's probe logprobs are those of the version sent even when the next train step was submitted right
after the send (they run before it on the trainer); an engine whose load was corrupted is not released (its
stream samples nothing) until the next sync sends it full weights, verified bit-exact; a verified engine is
released and its held requests continue on the new version.

    .venv/bin/python -m pytest tests/integration/test_overlapped_sync.py -q
"""
from __future__ import annotations

import time

import pytest
import ray

from orchestrator.rollout.types import PromptRequest
from orchestrator.weight_sync.overlapped import OverlappedSyncs
from orchestrator.weight_sync.syncer import make_syncer
from tests.integration.test_weight_sync import _assert_bit_exact, _cfg, _kill, _start, _train_once

pytestmark = pytest.mark.integration


def _drain(engine, want: int, timeout_s: float) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += ray.get(engine.stream_drain.remote(0.2))[0]
    return got


def test_an_overlapped_sync_probes_the_version_sent_and_holds_a_corrupted_engine_until_the_next_sync(
        ray_local, tiny_model, tmp_path):
    cfg = _cfg(tiny_model, tmp_path, "rollout.max_new_tokens=8", "rollout.n=2")
    trainer, engines = _start(cfg, tiny_model)
    try:
        syncer = make_syncer(cfg, trainer, engines)
        syncs = OverlappedSyncs(syncer, retries=1)
        syncer.sync(0)  # the engines' first sync (probed): both verified on the starting weights
        _train_once(trainer, 1)
        ray.get(engines[1].extension_call.remote("inject_fault_next_load"))
        metrics = syncs.start(1)  # held, loaded and probed on the engines; the trainer probes version 1 ...
        train = trainer.train_step.remote(_batch_ref_for_next_step())  # ... before this step reaches it
        requests = [PromptRequest(group_id=g, prompt_ids=[1, 2, 3, 4], answer="") for g in range(2)]
        for e in engines:  # queued behind the hold: nothing is sampled before the engine is verified
            ray.get(e.stream_submit.remote(requests))
        assert metrics["sync/version"] == 1 and metrics["sync/send_s"] > 0
        settled = syncs.settle()
        ray.get(train)
        assert settled["sync/failures"] == 1 and settled["sync/probe_max_abs_diff"] < 1e-3  # engine 0 probed on v1
        assert settled["sync/version"] == 1 and syncer.engine_versions == [1, None]
        prompt, cont = syncer.probe_ids  # the step submitted after the send moved the probe: the order mattered
        after = ray.get(trainer.probe_logprobs.remote(prompt, cont))
        sent = ray.get(engines[0].probe_logprobs.remote(prompt, cont))
        assert max(abs(a - b) for a, b in zip(after.logprobs, sent.logprobs)) > 1e-3
        finished = _drain(engines[0], 4, 60.0)  # released: its requests finish on version 1 ...
        assert len(finished) == 4 and all(set(s.token_versions) == {1} for s in finished)
        assert _drain(engines[1], 1, 3.0) == []  # ... the corrupted one samples nothing
        syncs.start(2)  # full weights to engine 1, probed (a fresh version)
        assert syncs.settle()["sync/failures"] == 0 and syncer.engine_versions == [2, 2]
        _assert_bit_exact(trainer, engines, "float32")
        finished = _drain(engines[1], 4, 60.0)
        assert len(finished) == 4 and all(set(s.token_versions) == {2} for s in finished)
    finally:
        _kill(trainer, *engines)


def _batch_ref_for_next_step():
    from orchestrator.algo import TrainBatch

    prompts, responses = [[7, 8, 9, 10]] * 2, [[11, 12, 13]] * 2
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-1.0] * 3] * 2, [1.0, -1.0])
