"""The default job (SmolLM2-135M-Instruct, arithmetic GRPO) for one step through `ray job submit`
against a local head started with `ray start --head`, as docs/deployment.md shows.

One step runs every phase of the job: the held-out eval at step 0, sampling, reward, training, the verified
weight sync that ends the step, the final eval on the synced weights (so the engine samples from trained weights)
and the final checkpoint; a second step would repeat them (the tiny-model integration tests run several)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
DASHBOARD = "http://127.0.0.1:8265"


def _wait_for_dashboard(timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{DASHBOARD}/api/version", timeout=5)
            return
        except urllib.error.HTTPError:  # 401 without a token: the dashboard is up and guarded
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"the Ray dashboard at {DASHBOARD} did not come up in {timeout_s:g}s")


@pytest.fixture
def ray_head():
    # Ray's token authentication, as docs/deployment.md shows: the head makes a token, the clients send it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "token"}
    subprocess.run([RAY, "start", "--head", "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                    "--dashboard-port=8265", "--disable-usage-stats"], check=True, env=env, capture_output=True)
    try:
        _wait_for_dashboard()
        yield env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True)


def test_default_job_through_ray_job_submit(ray_head, tmp_path):
    out = tmp_path / "run"
    cmd = [RAY, "job", "submit", "--address", DASHBOARD, "--working-dir", str(REPO), "--",
           sys.executable, "-m", "orchestrator", "configs/grpo_arith_cpu.yaml", "trainer.total_steps=1",
           f"run.output_dir={out}", f"checkpoint.dir={out}/ckpt", "run.progress=false",
           "eval.num_prompts=16", "rollout.prompts_per_step=2"]  # every phase on less: eval 16 of the demo's 64
    # prompts (steps 0 and 1), a step of 2 groups of rollout.n=8 (the demo's 4)
    for _ in range(75):  # the dashboard answers before the head's job agent registers: Ray says to retry
        proc = subprocess.run(cmd, env=ray_head, capture_output=True, text=True, timeout=1200)
        if proc.returncode == 0 or "No available agent to submit job" not in proc.stderr:
            break
        time.sleep(2)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert "succeeded" in proc.stdout, tail
    assert "final checkpoint:" in proc.stdout, tail
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1]
    assert [r["step"] for r in rows if "eval/pass_at_1" in r] == [0, 1]  # the demo's held-out eval: step 0, the end
    assert all(r["eval/prompts"] == 16 for r in rows if "eval/pass_at_1" in r)
    assert all(0.0 <= r["reward/mean"] <= 1.0 and r["rollout/tokens"] > 0 for r in rows if "reward/mean" in r)
    ckpt = out / "ckpt" / "step_000001" / "policy"
    assert (ckpt / "config.json").is_file() and any(ckpt.glob("*.safetensors"))
