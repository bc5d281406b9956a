"""Partial rollouts on the real vLLM engine (actors/rollout/interruptible.py): a generation interrupted by a
weight update continues on the new weights, keeping its tokens; each token carries the version that sampled
it and that version's logprob; the continued tokens' logprobs are the new weights' (no KV of the old weights
served); a weight load while requests hold KV blocks is refused.

The tiny random Llama's weights change visibly between versions (every tensor scaled by 1.5 and shifted),
so a logprob from the wrong version is off by far more than the tolerance.

    .venv/bin/python -m pytest tests/integration/test_partial_rollout.py -q
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

pytestmark = pytest.mark.integration

TOKENS, FIRST_STEPS = 20, 6
# AsyncLLM's core generates on while the driver is not stepping, and its front end hands over every token that arrived
# since: one step (the first output) is the interruption point, with room left in a longer budget
ASYNC_TOKENS, ASYNC_FIRST_STEPS = 64, 1


def _write_version(src: Path, dest: Path, version: int, scale: float, noise_seed: int = 1) -> str:
    """The tiny model's tensors (times `scale`, plus a small shift unless scale is 1) as a disk weight-sync
    version folder (actors/weight_sync/disk.py's layout)."""
    import torch
    from safetensors.torch import load_file, save_file

    from actors.weight_sync.disk import MANIFEST

    tensors = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(noise_seed)
    if scale != 1.0:
        tensors = {k: t * scale + 0.02 * torch.randn(t.shape, generator=gen) for k, t in tensors.items()}
    folder = dest / f"v{version}"
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "shard-00000.safetensors"))
    (folder / MANIFEST).write_text(json.dumps({"version": version, "files": ["shard-00000.safetensors"]}))
    return str(folder)


@ray.remote(num_cpus=1)
class _Scenario:
    def run(self, model: str, folders: dict, engine_kind: str, tokens: int, first_steps: int) -> dict:
        from actors.rollout.worker import make_engine
        from orchestrator.config import load_config
        from orchestrator.rollout.partial import samples_of
        from orchestrator.rollout.types import PromptRequest

        cfg = load_config(None, ["rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.kv_cache_space_gib=1",
                                 "rollout.ignore_eos=true", f"rollout.engine={engine_kind}"]).rollout
        engine = make_engine(model, cfg, seed=0)
        gen = engine.interruptible()
        prompts = [engine.tokenizer.encode(t) for t in ("What is 2+3?", "Name a colour.")]
        samples = [s for g, ids in enumerate(prompts) for s in samples_of(PromptRequest(g, ids, "", seed=7 + g), 2, tokens)]
        gen.add(samples, version=0)
        early = gen.run(max_steps=first_steps)
        paused = gen.interrupt()
        engine.update_weights("disk", folders["v1"], 1)
        gen.add(paused, version=1)
        done = gen.run()
        out = {"early": len(early), "paused": len(paused), "interruptions": gen.interruptions, "samples": []}
        engine.update_weights("disk", folders["v2"], 2)  # version 2 = the original weights
        for s in samples:
            first = len(s.request.prompt_ids)
            out["samples"].append({"versions": s.token_versions, "logprobs": s.logprobs, "done": s.finish_reason,
                                   "interruptions": s.interruptions, "text": gen.text(s),
                                   "v0": engine.prompt_logprobs(s.prompt_ids, first)})
        engine.update_weights("disk", folders["v3"], 3)  # version 1's weights again
        for entry, s in zip(out["samples"], samples):
            entry["v1"] = engine.prompt_logprobs(s.prompt_ids, len(s.request.prompt_ids))
        gen.add(samples_of(PromptRequest(9, prompts[0], "", seed=1), 1, tokens), version=3)
        gen.step()
        try:
            engine.update_weights("disk", folders["v4"], 4)
            out["refused"] = ""
        except RuntimeError as e:
            out["refused"] = str(e)
        out["done"] = len(done)
        engine.close()
        return out


@pytest.mark.parametrize("engine", ["in_process", "async_llm"])
def test_interrupted_generation_continues_on_new_weights_with_per_token_versions(ray_local, tiny_model, tmp_path,
                                                                                  engine):
    """Both engines (rollout.engine): vLLM's LLM stepped here, and AsyncLLM whose core steps in its own process."""
    folders = {"v1": _write_version(tiny_model, tmp_path, 1, 1.5), "v2": _write_version(tiny_model, tmp_path, 2, 1.0),
               "v3": _write_version(tiny_model, tmp_path, 3, 1.5), "v4": _write_version(tiny_model, tmp_path, 4, 1.0)}
    tokens, first_steps = (TOKENS, FIRST_STEPS) if engine == "in_process" else (ASYNC_TOKENS, ASYNC_FIRST_STEPS)
    out = ray.get(_Scenario.remote().run.remote(str(tiny_model), folders, engine, tokens, first_steps))
    assert out["early"] == 0 and out["paused"] == out["interruptions"] == 4 and out["done"] == 4
    for s in out["samples"]:
        v = s["versions"]
        old = v.count(0)
        assert s["done"] == "length" and len(v) == tokens and s["interruptions"] == 1
        assert 1 <= old < tokens and v == [0] * old + [1] * (tokens - old)  # tokens kept, then the new version
        lp = s["logprobs"]
        # each token's behaviour logprob is its own version's: the old weights' before the update, the new after
        assert max(abs(a - b) for a, b in zip(lp[:old], s["v0"][:old])) < 1e-3
        assert max(abs(a - b) for a, b in zip(lp[old:], s["v1"][old:])) < 1e-3
        # and the versions differ visibly on the continued tokens (a wrong version would fail above)
        assert max(abs(a - b) for a, b in zip(s["v0"][old:], s["v1"][old:])) > 0.05
    assert "requests still hold KV blocks" in out["refused"]


@ray.remote(num_cpus=1)
class _Worker:
    def run(self, model: str, folder: str, engine: str) -> dict:
        import time

        from actors.rollout.worker import RolloutWorker
        from orchestrator.config import load_config
        from orchestrator.rollout.types import PromptRequest

        cfg = load_config(None, ["rollout.kv_cache_space_gib=1", "rollout.ignore_eos=true", "rollout.n=4",
                                 f"rollout.max_new_tokens={TOKENS * 8}", f"rollout.engine={engine}"]).rollout
        worker = RolloutWorker(model, cfg)
        ids = worker.engine.tokenizer.encode("What is 2+3?")
        worker.stream_submit([PromptRequest(g, ids, "", seed=g) for g in range(2)])
        while worker.stream_drain(0.05)[1]["stream/running"] == 0:
            pass
        time.sleep(0.3)  # some tokens sampled by version 0
        checks = worker.weight_sync("disk", "load", folder, 1)  # the stream is paused, loads, continues
        probe = worker.probe_logprobs(ids[:3], ids[3:])  # the sync probe runs while the engine streams
        samples, metrics, deadline = [], {}, time.monotonic() + 120
        while len(samples) < 8 and time.monotonic() < deadline:
            got, metrics = worker.stream_drain(1.0)
            samples += got
        worker.stream.close()
        return {"version": checks["version"], "probe": len(probe.logprobs), "metrics": metrics,
                "samples": [(s.key, s.token_versions, s.finish_reason, bool(s.text)) for s in samples]}


@pytest.mark.parametrize("engine", ["in_process", "async_llm"])
def test_a_weight_sync_interrupts_the_workers_stream_and_every_sample_continues_once(ray_local, tiny_model, tmp_path,
                                                                                   engine):
    out = ray.get(_Worker.remote().run.remote(str(tiny_model), _write_version(tiny_model, tmp_path, 1, 1.5), engine))
    assert out["version"] == 1 and out["probe"] > 0
    # the load aborts the 8 requests in flight; the probe, a call of its own, aborts them again if the engine took
    # them back in between (its driver steps between two calls into the engine)
    assert out["metrics"]["stream/interruptions"] in (8, 16) and out["metrics"]["stream/running"] == 0
    keys = [k for k, *_ in out["samples"]]
    assert sorted(keys) == sorted(f"{g}:{i}" for g in range(2) for i in range(4))  # each sample once
    for _, versions, finish, has_text in out["samples"]:
        old = versions.count(0)
        assert finish == "length" and len(versions) == TOKENS * 8 and has_text
        assert 1 <= old < len(versions) and versions == [0] * old + [1] * (len(versions) - old)

