"""A real Prometheus server scrapes a real GRPO run (the tiny random model, a few steps) while it runs.

The run is `python -m orchestrator` in a subprocess with `metrics.prometheus_port` set; Prometheus scrapes
it every second. After the run, PromQL over the stored samples must return the step counter and the phase
histograms, and their values must agree with the run's own metrics.jsonl. Prometheus also scrapes the run's
Ray metrics agent (`metrics.ray_export_port`), where vLLM's own engine metrics arrive as `ray_vllm_*`; every
`ray_vllm_*` name the Grafana dashboard plots must have been scraped. Needs the Debian package `prometheus`
(`make system-deps`).

    .venv/bin/python -m pytest tests/deploy/test_prometheus_live.py -q
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from orchestrator.metrics import read_jsonl
from tests.deploy.test_prometheus import DASHBOARD, _binary, _free_port, _query
from tests.integration.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def _start_prometheus(tmp_path: Path, target_port: int, ray_port: int) -> tuple[subprocess.Popen, str, Path]:
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "rl-orchestrator",
                                  "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]},
                                 {"job_name": "ray", "static_configs": [{"targets": [f"127.0.0.1:{ray_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    port, log = _free_port(), tmp_path / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([_binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", log


def _metric_names(base: str, regex: str) -> set[str]:
    """Names of the stored series matching `regex` (Prometheus' label-values API over the whole TSDB)."""
    url = f"{base}/api/v1/label/__name__/values?" + urllib.parse.urlencode({"match[]": f'{{__name__=~"{regex}"}}'})
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return set(body["data"])


def _scalar(base: str, promql: str) -> float:
    result = _query(base, promql)
    assert len(result) == 1, f"{promql} returned {result}"
    return float(result[0]["value"][1])


def test_prometheus_scrapes_a_live_grpo_run(tmp_path, tiny_model):
    metrics_port, ray_port = _free_port(), _free_port()
    proc, base, log = _start_prometheus(tmp_path, metrics_port, ray_port)
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_model, out, **{"trainer.total_steps": STEPS, "run.name": "live",
                                                   "metrics.prometheus_port": metrics_port,
                                                   "metrics.ray_export_port": ray_port,
                                                   "reward.functions": "[{name: 'tests.integration.helpers:length_reward'}]"})
    env = {**os.environ, "RAY_metrics_report_interval_ms": "1000"}  # Ray's agent flushes every second
    try:
        run = subprocess.run([sys.executable, "-m", "orchestrator", "configs/grpo_arith_cpu.yaml", *overrides],
                             cwd=ROOT, capture_output=True, text=True, timeout=800, env=env)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        time.sleep(2)  # let the TSDB head settle; the samples were taken while the run ran
        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        window = "[30m]"
        # the highest step Prometheus saw while the run lived: at least one step, at most the last
        seen = _scalar(base, f'max_over_time(rl_orch_trainer_step{{run="live"}}{window})')
        assert 1 <= seen <= STEPS, (seen, log.read_text()[-2000:])
        count = _scalar(base, f'max_over_time(rl_orch_phase_seconds_count{{run="live", phase="train"}}{window})')
        assert count == seen  # one train observation per step
        # the histogram's sum at its last scrape equals the run's own train seconds of those steps
        total = _scalar(base, f'max_over_time(rl_orch_phase_seconds_sum{{run="live", phase="train"}}{window})')
        assert total == pytest.approx(sum(r["timing/train_s"] for r in rows[: int(seen)]), rel=1e-6)
        # the trainer's peak memory (RSS on CPU, the CUDA allocator's peak on a GPU) as a byte gauge
        rss = _scalar(base, f'max_over_time(rl_orch_memory_bytes{{run="live", name="trainer_peak_rss"}}{window})')
        assert rss == max(r["memory/trainer_peak_rss_bytes"] for r in rows[: int(seen)]) and rss > 100 * 2**20
        engine = _scalar(base, f'max_over_time(rl_orch_memory_bytes{{run="live", name="rollout_peak_rss"}}{window})')
        assert engine == max(r["memory/rollout_peak_rss_bytes"] for r in rows[: int(seen)]) and engine > 100 * 2**20
        up = _query(base, f'up{{job="rl-orchestrator"}}')
        assert up and up[0]["metric"]["instance"] == f"127.0.0.1:{metrics_port}"
        # Ray's node metrics agent, and vLLM's own engine metrics through it (rollout.ray_metrics)
        assert _query(base, f'max_over_time(up{{job="ray"}}{window})')[0]["value"][1] == "1"
        vllm_tokens = _scalar(base, f'max(max_over_time(ray_vllm_generation_tokens_total{window}))')
        probes = sum("sync/probe_s" in r for r in rows)  # each weight-sync probe samples one token (max_tokens=1)
        assert 0 < vllm_tokens <= sum(r["rollout/tokens"] for r in rows) + probes, (vllm_tokens, log.read_text()[-2000:])
        # every vLLM metric the Grafana dashboard plots was really scraped
        scraped = _metric_names(base, "ray_vllm_.*")
        if all(r["rollout/prefix_cache_hit_rate"] == 0 for r in rows):  # Ray exports a counter at its first inc
            scraped.add("ray_vllm_prefix_cache_hits_total")
        for name in sorted(set(re.findall(r"\bray_vllm_[a-z_]+", DASHBOARD.read_text()))):
            assert name in scraped, f"dashboard metric {name} was never scraped; vLLM metrics seen: {sorted(scraped)}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
