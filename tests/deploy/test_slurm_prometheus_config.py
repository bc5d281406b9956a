"""The per-job Prometheus config the Slurm launcher writes (deploy/slurm/prometheus_config.py), without
Slurm: run as rl_orch.sbatch runs it, parsed, and checked with `promtool check config` (rule files
loaded, so the absolute alerts.yml path must resolve). Needs promtool (Debian package `prometheus`,
scripts/install_system_deps.sh). The launcher's own call is checked by tests/deploy/test_slurm.py.

    .venv/bin/python -m pytest tests/deploy/test_slurm_prometheus_config.py -q
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "deploy" / "slurm" / "prometheus_config.py"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
CONFIG = "configs/grpo_arith_cpu.yaml"


def generate(tmp_path: Path, *args: str, sd_file: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the generator from the repo root (as the launcher does, `cd $WORKDIR`); (result, config path)."""
    out = tmp_path / "run" / "rl_orch-42.prometheus.yml"
    sd = sd_file if sd_file is not None else tmp_path / "ray_slurm_42" / "prom_metrics_service_discovery.json"
    cmd = [sys.executable, str(GENERATOR), "--out", str(out), "--sd-file", str(sd), "--head", "10.1.2.3",
           "--job-id", "42", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120), out


def promtool_check(config: Path) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("`promtool` not found on PATH: install the Debian package `prometheus` "
                    "(scripts/install_system_deps.sh, run by `make system-deps` / `make test`)")
    return subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60,
                          cwd=config.parent.parent)  # elsewhere than the rules' folder: the path is absolute


def jobs(config: Path) -> dict:
    return {j["job_name"]: j for j in yaml.safe_load(config.read_text())["scrape_configs"]}


def test_config_scrapes_the_jobs_discovery_file_and_the_head(tmp_path):
    sd = tmp_path / "ray_slurm_42" / "prom_metrics_service_discovery.json"
    sd.parent.mkdir()
    sd.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": ["10.1.2.3:8080", "10.1.2.4:8080"]}]))
    result, out = generate(tmp_path, "--run-config", CONFIG, "--",
                           "metrics.prometheus_port=9400", "metrics.prometheus_host=0.0.0.0", sd_file=sd)
    assert result.returncode == 0, result.stderr
    assert "controller target: 10.1.2.3:9400" in result.stdout
    config = yaml.safe_load(out.read_text())
    assert config["rule_files"] == [str(ALERTS)] and Path(config["rule_files"][0]).is_absolute()
    assert config["global"]["external_labels"]["slurm_job_id"] == "42"
    scrape = jobs(out)
    assert set(scrape) == {"rl-orchestrator", "ray", "prometheus"}
    assert scrape["rl-orchestrator"]["static_configs"] == [{"targets": ["10.1.2.3:9400"]}]
    assert scrape["ray"]["file_sd_configs"][0]["files"] == [str(sd)]
    check = promtool_check(out)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"Checking {ALERTS}" in check.stdout and "SUCCESS: 1 rule files found" in check.stdout, check.stdout
    assert "WARNING" not in check.stdout + check.stderr, check.stdout + check.stderr  # the discovery file is found


def test_loopback_controller_and_metrics_off(tmp_path):
    # a run that keeps the default host (127.0.0.1) is scraped on loopback, by a Prometheus on the head node
    result, out = generate(tmp_path, "--run-config", CONFIG, "--", "metrics.prometheus_port=9411")
    assert result.returncode == 0, result.stderr
    assert jobs(out)["rl-orchestrator"]["static_configs"] == [{"targets": ["127.0.0.1:9411"]}]
    # the demo config serves no /metrics (metrics.prometheus_port=0): no controller job, still a valid config
    result, out = generate(tmp_path, "--run-config", CONFIG)
    assert result.returncode == 0, result.stderr
    assert set(jobs(out)) == {"ray", "prometheus"}
    check = promtool_check(out)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_bad_run_config_leaves_the_controller_out_with_a_warning(tmp_path):
    result, out = generate(tmp_path, "--run-config", CONFIG, "--", "rollout.nn=3")
    assert result.returncode == 0, result.stderr
    assert "warning" in result.stderr and "rollout.nn" in result.stderr
    assert set(jobs(out)) == {"ray", "prometheus"}


@pytest.mark.parametrize("args, sd_file, option", [
    ((), Path("relative/prom_metrics_service_discovery.json"), "--sd-file"),
    (("--controller-port", "70000"), None, "metrics.prometheus_port"),
    (("--scrape-interval", "0"), None, "--scrape-interval"),
    (("metrics.prometheus_port=1",), None, "--run-config"),
])
def test_bad_arguments_exit_2_naming_the_option(tmp_path, args, sd_file, option):
    result, out = generate(tmp_path, *args, sd_file=sd_file)
    assert result.returncode == 2 and option in result.stderr, result.stderr
    assert not out.exists()


def test_explicit_controller_port_ipv6_head(tmp_path):
    out = tmp_path / "p.yml"
    result = subprocess.run([sys.executable, str(GENERATOR), "--out", str(out), "--sd-file", "/tmp/x/sd.json",
                             "--head", "fd00::5", "--controller-host", "0.0.0.0", "--controller-port", "9400"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert jobs(out)["rl-orchestrator"]["static_configs"] == [{"targets": ["[fd00::5]:9400"]}]
    check = promtool_check(out)
    assert check.returncode == 0, check.stdout + check.stderr
