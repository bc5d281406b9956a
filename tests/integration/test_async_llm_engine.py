"""rollout.engine=async_llm's engine core (vLLM's AsyncLLM, a process of its own) dying on its own (docs/faults.md):
a call in flight into it raises within seconds instead of waiting forever, and the rollout worker's actor ends its
own process, so that the job replaces it as any lost worker (tests/integration/test_rollout_restart.py: that path;
the actor's end is checked on an engine of tests/integration/test_weight_sync.py's async_llm run).

    .venv/bin/python -m pytest tests/integration/test_async_llm_engine.py -q
"""
from __future__ import annotations

import pytest
import ray

from tests.integration.test_partial_rollout import _write_version

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=1)
class _DeadCore:
    def run(self, model: str, folder: str) -> dict:
        import multiprocessing
        import os
        import signal
        import threading
        import time

        from actors.rollout.worker import RolloutWorker
        from orchestrator.config import load_config
        from orchestrator.rollout.types import PromptRequest

        cfg = load_config(None, ["rollout.kv_cache_space_gib=1", "rollout.ignore_eos=true", "rollout.n=2",
                                 "rollout.engine=async_llm", "weight_sync.strategy=disk"]).rollout
        worker = RolloutWorker(model, cfg)
        ids = worker.engine.tokenizer.encode("What is 2+3?")
        worker.stream_submit([PromptRequest(0, ids, "", seed=0)])
        worker.extension_call("inject_hang_next_load", 60.0)  # the core is inside the load when it dies
        cores = multiprocessing.active_children()  # the engine core this actor spawned
        killer = threading.Timer(3.0, lambda: [os.kill(core.pid, signal.SIGKILL) for core in cores])
        killer.start()
        t0, out = time.monotonic(), {"cores": len(cores)}
        try:
            worker.weight_sync("disk", "load", folder, 1)
            out["load"] = "returned"
        except Exception as e:  # noqa: BLE001 - RuntimeError (a call in flight) or vLLM's EngineDeadError (later)
            out["load"] = f"{type(e).__name__}: {e}"
        out["load_s"] = time.monotonic() - t0
        try:
            worker.stream_drain(5.0)
            out["drain"] = "returned"
        except Exception as e:  # noqa: BLE001 - the stream's RuntimeError, its cause the engine's
            out["drain"] = f"{type(e).__name__}: {e}"
        return out


def test_a_dead_async_llm_engine_core_fails_the_calls_instead_of_hanging(ray_local, tiny_model, tmp_path):
    """rollout.engine=async_llm: the engine core (a process of its own) killed in the middle of a weight load; the load
    and the stream's next drain raise, within seconds, not after the load's 60 s (vLLM fails a call in flight only
    through its output stream: AsyncLLMEngine.run watches the core)."""
    out = ray.get(_DeadCore.remote().run.remote(str(tiny_model), _write_version(tiny_model, tmp_path, 1, 1.5)),
                  timeout=180)
    assert out["cores"] >= 1
    assert "engine core process died" in out["load"] and out["load_s"] < 30, out
    assert out["drain"] != "returned" and "engine" in out["drain"].lower(), out
