"""Monitoring: the Prometheus exporter (orchestrator/metrics/prometheus.py), its hook in the controller's
run(), deploy/prometheus (promtool check + alert unit tests), the Grafana dashboard's PromQL, and a real
Prometheus server scraping the exporter. Needs the Debian package `prometheus` (prometheus, promtool;
`make system-deps`); a missing binary fails the test that needs it, naming it.

    .venv/bin/python -m pytest tests/deploy/test_prometheus.py -q
"""
from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.runtime.faults import RestartBudget
from prometheus_client import generate_latest
from omegaconf import OmegaConf
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.metrics import read_jsonl
from orchestrator.metrics import SinkContext, registry
from orchestrator.metrics.prometheus import METRICS, ROW_COUNTERS, ROW_GAUGES, PrometheusExporter, error_kind
from orchestrator.weight_sync import WeightMismatchError

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "rl-orchestrator.json"
DEMO_ROWS = read_jsonl(ROOT / "docs" / "demo_metrics.jsonl")


# ---- helpers --------------------------------------------------------------------------------------
def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` not found on PATH: install the Debian package `prometheus` "
                    "(scripts/install_system_deps.sh, run by `make system-deps` / `make test`)")
    return path


def _promtool(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([_binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, input=stdin,
                          timeout=60)


def _samples(text: str) -> dict:
    """{(sample name, ((label, value), ...)): value} of a /metrics text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, metric: str, run: str = "demo", **labels) -> float:
    key = (metric, tuple(sorted({"run": run, **labels}.items())))
    assert key in samples, f"{metric}{labels} not exported; have {sorted({k[0] for k in samples})}"
    return samples[key]


def _registry_samples(exporter: PrometheusExporter) -> dict:
    return _samples(generate_latest(exporter.registry).decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except OSError:
        return True
    return False


@pytest.fixture
def exporter():
    e = PrometheusExporter("127.0.0.1", 0, "demo")
    yield e
    e.close()


# ---- the exporter ---------------------------------------------------------------------------------
# (metric, extra labels, row key): the gauge/histogram-sum that carries the row key's value
DEMO_EXPECTED = [
    ("rl_orch_trainer_step", {}, "step"),
    ("rl_orch_trainer_step_seconds_sum", {}, "timing/step_s"),
    ("rl_orch_phase_seconds_sum", {"phase": "generate"}, "timing/generate_s"),
    ("rl_orch_phase_seconds_sum", {"phase": "train"}, "timing/train_s"),
    ("rl_orch_phase_seconds_sum", {"phase": "weight_sync"}, "timing/weight_sync_s"),
    ("rl_orch_rollout_tokens_per_second", {}, "rollout/tokens_per_s"),
    ("rl_orch_rollout_tokens_total", {}, "rollout/tokens"),
    ("rl_orch_rollout_response_length_tokens", {}, "rollout/response_len_mean"),
    ("rl_orch_reward_mean", {}, "reward/mean"),
    ("rl_orch_reward_std", {}, "reward/std"),
    ("rl_orch_actor_kl", {}, "actor/kl"),
    ("rl_orch_actor_clipped_ratio", {}, "actor/clip_frac"),
    ("rl_orch_actor_loss", {}, "actor/loss"),
    ("rl_orch_actor_grad_norm", {}, "actor/grad_norm"),
    ("rl_orch_actor_learning_rate", {}, "actor/lr"),
    ("rl_orch_sync_seconds", {}, "timing/weight_sync_s"),
    ("rl_orch_sync_bytes", {}, "sync/bytes"),
]


def test_every_row_key_maps_to_a_declared_metric():
    """A row key mapped to an undeclared metric would stop the run at its first row (KeyError in the sink)."""
    names = {m[0] if isinstance(m, tuple) else m for m in (*ROW_GAUGES.values(), *ROW_COUNTERS.values())}
    assert names and names <= set(METRICS), names - set(METRICS)


def test_observe_demo_row_serves_expected_series(exporter):
    row = DEMO_ROWS[0]
    exporter.log_row(row)
    assert exporter.port > 0
    samples = _samples(urllib.request.urlopen(exporter.url, timeout=5).read().decode())  # over HTTP
    for name, labels, key in DEMO_EXPECTED:
        assert _value(samples, name, **labels) == pytest.approx(row[key]), (name, key)
    assert _value(samples, "rl_orch_trainer_steps_total") == 1
    assert _value(samples, "rl_orch_phase_seconds_count", phase="generate") == 1
    assert _value(samples, "rl_orch_phase_seconds_bucket", phase="generate", le="50.0") == 1  # 39 s
    assert _value(samples, "rl_orch_phase_seconds_bucket", phase="generate", le="25.0") == 0
    assert _value(samples, "rl_orch_actor_loss_nan") == 0
    assert _value(samples, "rl_orch_errors_total", kind="reward") == 0
    assert not any(k[0] == "rl_orch_phase_seconds_count" and ("phase", "step") in k[1] for k in samples)
    # keys the demo row lacks leave their metrics absent
    names = {k[0] for k in samples}
    assert not names & {"rl_orch_rollout_prefix_cache_hit_ratio", "rl_orch_rollout_staleness_steps",
                        "rl_orch_memory_bytes", "rl_orch_trainer_tokens_per_second"}


def test_rows_accumulate_and_optional_keys_are_exported(exporter):
    for row in DEMO_ROWS[:3]:
        exporter.log_row(row)
    exporter.log_row({"rollout/prefix_cache_hit_rate": 0.75, "rollout/staleness": 1, "rollout/queue_depth": 2,
                      "memory/trainer_peak_gib": 1.5, "memory/util_frac": 0.5, "sync/seconds": 3.0,
                      "unknown/key": 7.0, "sync/strategy": "nccl", "actor/kl": None, "rollout/mismatch_kl_k3": 2e-4,
                      "rollout/mismatch_ratio_max": 1.5, "rollout/mismatch_masked_token_frac": 0.01,
                      "actor/entropy": 0.625, "actor/approx_kl_old": 0.002, "actor/update_ratio": 1e-4})
    s = _registry_samples(exporter)
    assert _value(s, "rl_orch_actor_entropy_nats") == 0.625 and _value(s, "rl_orch_actor_approx_kl_old") == 0.002
    assert _value(s, "rl_orch_actor_update_ratio") == 1e-4
    assert _value(s, "rl_orch_trainer_step") == 3
    assert _value(s, "rl_orch_trainer_steps_total") == 3  # the 4th row has no step
    assert _value(s, "rl_orch_phase_seconds_count", phase="train") == 3
    assert _value(s, "rl_orch_rollout_tokens_total") == sum(r["rollout/tokens"] for r in DEMO_ROWS[:3])
    assert _value(s, "rl_orch_rollout_prefix_cache_hit_ratio") == 0.75
    assert _value(s, "rl_orch_rollout_staleness_steps") == 1
    assert _value(s, "rl_orch_rollout_queue_depth") == 2
    assert (_value(s, "rl_orch_rollout_mismatch_kl"), _value(s, "rl_orch_rollout_mismatch_ratio_max"),
            _value(s, "rl_orch_rollout_mismatch_masked_ratio")) == (2e-4, 1.5, 0.01)
    assert _value(s, "rl_orch_memory_bytes", name="trainer_peak") == 1.5 * 2**30
    assert _value(s, "rl_orch_memory_value", name="util_frac") == 0.5
    assert _value(s, "rl_orch_sync_seconds") == 3.0  # the sync's own timer
    assert _value(s, "rl_orch_actor_kl") == DEMO_ROWS[2]["actor/kl"]  # None leaves it as it was
    assert not any("unknown" in k[0] for k in s)


def test_nan_loss_sets_the_nan_gauge_and_keeps_the_raw_loss(exporter):
    exporter.log_row({"step": 1, "actor/loss": float("nan")})
    s = _registry_samples(exporter)
    assert _value(s, "rl_orch_actor_loss_nan") == 1
    assert math.isnan(_value(s, "rl_orch_actor_loss"))
    exporter.log_row({"step": 2, "actor/loss": 0.5})
    assert _value(_registry_samples(exporter), "rl_orch_actor_loss_nan") == 0
    exporter.log_row({"step": 3, "actor/loss": None})  # the JSONL log's spelling of NaN / inf
    assert _value(_registry_samples(exporter), "rl_orch_actor_loss_nan") == 1
    exporter.log_row({"step": 4, "actor/loss": float("inf")})
    assert _value(_registry_samples(exporter), "rl_orch_actor_loss_nan") == 1


def test_skipped_updates_and_guards_are_exported(exporter):
    assert _value(_registry_samples(exporter), "rl_orch_actor_skipped_updates_total") == 0  # exists from the start
    exporter.log_row({"step": 1, "actor/skipped_updates": 1.0, "actor/skipped_in_a_row": 1.0,
                      "guard/reward_collapse": 1.0, "guard/grad_norm_spike": 0.0})
    exporter.log_row({"step": 2, "actor/skipped_updates": 0.0, "actor/skipped_in_a_row": 0.0,
                      "guard/reward_collapse": 0.0, "guard/grad_norm_spike": 1.0})
    s = _registry_samples(exporter)
    assert _value(s, "rl_orch_actor_skipped_updates_total") == 1
    assert _value(s, "rl_orch_actor_skipped_updates_in_a_row") == 0
    assert _value(s, "rl_orch_guard_tripped", guard="reward_collapse") == 0
    assert _value(s, "rl_orch_guard_tripped", guard="grad_norm_spike") == 1


def test_errors_are_counted_by_kind(exporter):
    exporter.log_row({"step": 1, "reward/errors": 3.0, "reward/timeouts": 1.0})
    exporter.log_row({"step": 2, "reward/errors": 2.0, "reward/timeouts": 0.0, "reward/memory_errors": 2.0})
    exporter.count_error("sync")
    exporter.count_error("timeout")
    exporter.count_error("timeout")
    s = _registry_samples(exporter)
    assert _value(s, "rl_orch_errors_total", kind="reward") == 5
    assert _value(s, "rl_orch_errors_total", kind="reward_timeout") == 1
    assert _value(s, "rl_orch_errors_total", kind="reward_memory") == 2
    assert _value(s, "rl_orch_errors_total", kind="sync") == 1
    assert _value(s, "rl_orch_errors_total", kind="timeout") == 2
    assert _value(s, "rl_orch_errors_total", kind="step") == 0
    assert _value(s, "rl_orch_sync_failures_total") == 1
    with pytest.raises(ValueError, match="reward/errors"):
        exporter.log_row({"reward/errors": -1})


@pytest.mark.parametrize("row, key", [({"step": "abc"}, "step"), ({"step": True}, "step"), ({"step": -1}, "step"),
                                      ({"step": 3, "timing/generate_s": float("nan")}, "timing/generate_s"),
                                      ({"step": 3, "timing/generate_s": -5.0}, "timing/generate_s"),
                                      ({"step": 3, "reward/errors": "2"}, "reward/errors"),
                                      ({"step": 3, "actor/loss": 5.0, "reward/errors": -1}, "reward/errors")])
def test_a_bad_row_is_refused_whole_naming_the_key(exporter, row, key):
    exporter.log_row({"step": 1, "actor/loss": 0.5})
    with pytest.raises(ValueError, match=key):
        exporter.log_row(row)
    s = _registry_samples(exporter)
    assert _value(s, "rl_orch_trainer_step") == 1 and _value(s, "rl_orch_trainer_steps_total") == 1
    assert _value(s, "rl_orch_actor_loss") == 0.5  # nothing of the refused row was applied


@pytest.mark.parametrize("exc, kind", [(WeightMismatchError("checksum"), "sync"), (TimeoutError("hung"), "timeout"),
                                       (RuntimeError("boom"), "step")])
def test_with_block_counts_the_error_by_kind_reraises_and_stops_serving(exc, kind):
    e = PrometheusExporter("127.0.0.1", 0, "demo")
    assert error_kind(exc) == kind
    with pytest.raises(type(exc)):
        with e:
            raise exc
    assert _value(_registry_samples(e), "rl_orch_errors_total", kind=kind) == 1
    assert _refused(e.url)
    e.close()  # idempotent


def test_exporter_output_passes_promtool_check_metrics(exporter):
    for row in DEMO_ROWS[:2]:
        exporter.log_row(row)
    r = _promtool("check", "metrics", stdin=generate_latest(exporter.registry).decode())
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


# ---- the controller hook --------------------------------------------------------------------------
def exporter_for(metrics_cfg, run_name):
    """The sink the run's build_sinks makes from `metrics.prometheus_port` (None when off)."""
    return PrometheusExporter.from_config(OmegaConf.create({"metrics": metrics_cfg}), SinkContext(Path("."), run_name, 1))


def test_exporter_for_follows_metrics_prometheus_port(capsys):
    from orchestrator.config import load_config

    assert exporter_for(load_config().metrics, "r") is None  # default: off
    port = _free_port()
    e = exporter_for(load_config(None, [f"metrics.prometheus_port={port}"]).metrics, "r")
    try:
        assert isinstance(e, PrometheusExporter) and e.port == port
        assert capsys.readouterr().out.strip() == f"prometheus metrics: http://127.0.0.1:{port}/metrics"
    finally:
        e.close()


def _stub_controller(tmp_path, monkeypatch, port: int, fail_at: int | None = None):
    """A GRPOController whose actors, syncer, steps and plot are stubs; its run() loop is the real one.
    Returns (controller, list that receives the exporter, list of /metrics texts read during steps)."""
    import orchestrator.controller as controller_mod
    from orchestrator.config import load_config

    cfg = load_config(None, [f"metrics.prometheus_port={port}", "trainer.total_steps=3", "run.progress=false",
                             "run.name=hooked", f"run.output_dir={tmp_path}"])
    made, scraped = [], []

    class SpyExporter(PrometheusExporter):  # the real sink; keeps what the run's build_sinks made
        @classmethod
        def from_config(cls, cfg, ctx):
            made.append(PrometheusExporter.from_config(cfg, ctx))
            return made[-1]

    class StubJob:  # actors, syncer: not used by the stub steps
        actors = None
        restarts = RestartBudget(0)

        def start(self, resume_from=None):
            pass

        def settle_sync(self):  # no overlapped sync in flight: the stub steps sync nothing
            return {}

    monkeypatch.setitem(registry.SINKS, "prometheus", SpyExporter)
    monkeypatch.setattr(controller_mod, "preflight", lambda *a, **k: None)  # the memory plan has its own tests
    monkeypatch.setattr(controller_mod, "plot_run", lambda rows, path, title="": path)
    ctrl = object.__new__(controller_mod.GRPOController)
    ctrl.cfg, ctrl.out_dir, ctrl.resume_from, ctrl.last_checkpoint = cfg, tmp_path, None, None
    ctrl.start_step, ctrl.version, ctrl.job = 0, 0, StubJob()
    # what __init__ would have found:
    ctrl.model_path, ctrl.pad_id, ctrl.prompt_ids, ctrl.longest_prompt = tmp_path / "model", 0, [], 1
    ctrl.metrics_path = tmp_path / "metrics.jsonl"
    ctrl.start_rollouts = lambda: None  # no rollout workers in the stub
    ctrl.evaluator = SimpleNamespace(before_steps=lambda run, log: None, after_step=lambda run, step: {})  # eval off
    ctrl.scored, ctrl.reward_parts, ctrl.tokenizer = None, {}, None  # no completion samples (metrics.samples_every=0)

    def step(k):
        if k > 1:  # the previous step's row is being served
            scraped.append(urllib.request.urlopen(made[0].url, timeout=5).read().decode())
        if k == fail_at:
            raise WeightMismatchError(f"rollout worker 0 reports weight version {k - 1}, expected {k}")
        return dict(DEMO_ROWS[k - 1]), str(tmp_path / f"step_{k}")

    ctrl.step = step
    return ctrl, made, scraped


def test_controller_run_serves_metrics_when_the_port_is_set(tmp_path, monkeypatch):
    port = _free_port()
    ctrl, made, scraped = _stub_controller(tmp_path, monkeypatch, port)
    result = ctrl.run()
    assert len(result.rows) == 3 and len(made) == 1 and made[0].port == port
    assert [_value(_samples(t), "rl_orch_trainer_step", run="hooked") for t in scraped] == [1, 2]
    s = _registry_samples(made[0])
    assert _value(s, "rl_orch_trainer_steps_total", run="hooked") == 3
    assert _value(s, "rl_orch_phase_seconds_count", run="hooked", phase="generate") == 3
    assert _refused(made[0].url)  # closed when run() returns


def test_controller_counts_a_failed_step_and_reraises(tmp_path, monkeypatch):
    ctrl, made, _ = _stub_controller(tmp_path, monkeypatch, _free_port(), fail_at=2)
    with pytest.raises(WeightMismatchError):
        ctrl.run()
    s = _registry_samples(made[0])
    assert _value(s, "rl_orch_errors_total", run="hooked", kind="sync") == 1
    assert _value(s, "rl_orch_sync_failures_total", run="hooked") == 1
    assert _value(s, "rl_orch_trainer_step", run="hooked") == 1
    assert _refused(made[0].url)


# ---- deploy/prometheus ----------------------------------------------------------------------------
RAY_SD_FILE = "/tmp/ray/prom_metrics_service_discovery.json"  # where a `ray start` head writes it


def test_prometheus_config_is_valid(tmp_path):
    # promtool opens the file_sd files: checked against a discovery file as Ray writes it, in tmp_path (the real
    # one exists only while a Ray head with a dashboard runs, so the check does not depend on this machine's /tmp/ray)
    text = (PROM_DIR / "prometheus.yml").read_text()
    assert f'["{RAY_SD_FILE}"]' in text
    sd = tmp_path / "prom_metrics_service_discovery.json"
    sd.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": ["127.0.0.1:8080"]}]))
    (tmp_path / "prometheus.yml").write_text(text.replace(RAY_SD_FILE, str(sd)))
    shutil.copy(PROM_DIR / "alerts.yml", tmp_path / "alerts.yml")  # rule_files: next to the config
    r = _promtool("check", "config", str(tmp_path / "prometheus.yml"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout and "SUCCESS" in r.stdout + r.stderr


def test_alert_rules_are_valid_and_their_unit_tests_pass(tmp_path):
    r = _promtool("check", "rules", str(PROM_DIR / "alerts.yml"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _promtool("test", "rules", str(PROM_DIR / "alerts_test.yml"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROM_DIR / "alerts_test.yml").read_text()))
    assert {"RLOrchStepStalled", "RLOrchLossNaN"} <= tested


# ---- deploy/grafana -------------------------------------------------------------------------------
GRAFANA_VARS = {"${run}": "demo", "$run": "demo", "$__rate_interval": "1m", "${__rate_interval}": "1m",
                "$__interval": "15s", "${__interval}": "15s", "${window}": "5m", "$window": "5m"}


def _exprs(node) -> list[str]:
    if isinstance(node, dict):
        return ([node["expr"]] if isinstance(node.get("expr"), str) else []) + [
            e for k, v in node.items() if k != "expr" for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _substitute(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown dashboard variable in {expr!r}"
    return expr


def test_dashboard_panel_expressions_are_valid_promql(tmp_path):
    exprs = _exprs(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": _substitute(e)} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(rules, indent=1))  # JSON is YAML
    r = _promtool("check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout


def _exported_names() -> set[str]:
    """Every sample name the exporter can produce (counters: _total; histograms: _bucket, _sum, _count)."""
    suffixes = {"gauge": ("",), "counter": ("",), "histogram": ("_bucket", "_sum", "_count")}
    return {name + s for name, (kind, _, _) in METRICS.items() for s in suffixes[kind]}


def test_dashboard_and_alerts_use_only_exported_metric_names():
    exported = _exported_names()
    texts = {"dashboard": " ".join(_exprs(json.loads(DASHBOARD.read_text()))),
             "alerts.yml": (PROM_DIR / "alerts.yml").read_text()}
    for where, text in texts.items():
        unknown = set(re.findall(r"\brl_orch_[a-z_]+", text)) - exported
        assert not unknown, f"{where} uses metrics the exporter does not export: {sorted(unknown)}"


def test_dashboard_layout():
    d = json.loads(DASHBOARD.read_text())
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["run"]["type"] == "query" and "rl_orch_trainer_step" in variables["run"]["definition"]
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    for want in ("Phase", "Throughput", "Reward", "KL", "Weight sync", "Errors"):
        assert any(want in r for r in rows), f"no row about {want}: {rows}"
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in panels:
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["targets"] and all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in p["targets"]), p["title"]
    titles = " ".join(p["title"] for p in panels).lower()
    for want in ("phase", "tokens per second", "reward", "kl", "clipped", "loss", "sync seconds", "sync bytes",
                 "sync failures", "prefix cache", "errors", "step rate"):
        assert want in titles, f"no panel about {want!r}"


# ---- a real Prometheus server ---------------------------------------------------------------------
def _query(base: str, promql: str) -> list:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait_for(base: str, promql: str, want: float, proc: subprocess.Popen, log: Path, timeout_s: float = 30.0):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            last = _query(base, promql)
            if last and float(last[0]["value"][1]) == want:
                return last
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    pytest.fail(f"prometheus: {promql} did not return {want} within {timeout_s}s (last: {last}); "
                f"log:\n{log.read_text()[-3000:]}")


def test_real_prometheus_scrapes_the_exporter(tmp_path, exporter):
    binary = _binary("prometheus")
    for row in DEMO_ROWS[:3]:
        exporter.log_row(row)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(PROM_DIR / "alerts.yml")],
              "scrape_configs": [{"job_name": "rl-orchestrator",
                                  "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    port, log = _free_port(), tmp_path / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        result = _wait_for(base, 'rl_orch_trainer_step{run="demo"}', 3, proc, log)
        assert result[0]["metric"]["job"] == "rl-orchestrator"
        _wait_for(base, 'rl_orch_phase_seconds_count{run="demo", phase="generate"}', 3, proc, log)
        generate_s = _query(base, 'rl_orch_phase_seconds_sum{run="demo", phase="generate"}')
        assert float(generate_s[0]["value"][1]) == pytest.approx(sum(r["timing/generate_s"] for r in DEMO_ROWS[:3]))
        rules = json.loads(urllib.request.urlopen(f"{base}/api/v1/rules", timeout=5).read())["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} >= {"RLOrchStepStalled", "RLOrchLossNaN"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
