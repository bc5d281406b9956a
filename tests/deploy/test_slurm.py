"""The Slurm launcher (deploy/slurm/rl_orch.sbatch) against a real single-node Slurm started in a temp dir
(tests/deploy/slurm_cluster.py): a short GRPO run on the tiny random model ends COMPLETED with its
checkpoint, a failing run ends FAILED, and `scancel` of a long run leaves no Ray process behind.
The three jobs are submitted together when the first of their tests starts (`jobs`; the test cluster's partition
lets jobs share its cores, each job still asks for all of them and gets its own Ray cluster, ports, token and temp
dir): they run side by side, mostly waiting on Ray's start and stop, and each test then checks its own job.
Needs the Debian packages `slurm-wlm` and `munge` (`make system-deps`); about 1.5 minutes on 2 cores.

    .venv/bin/python -m pytest tests/deploy/test_slurm.py -v
"""
from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy.slurm_cluster import free_port
from tests.integration.conftest import tiny_overrides

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "deploy" / "slurm" / "rl_orch.sbatch"
RAY = str(Path(sys.executable).parent / "ray")
# `ray status` against a stopped cluster fails after ~6 s with these instead of ~45 s (processes are checked first)
_FAST_GCS_GIVE_UP = {"RAY_py_gcs_connect_timeout_s": "2", "RAY_gcs_rpc_server_connect_timeout_s": "1"}
# After `scancel` the run's driver (`python -m orchestrator`, started by Ray's job supervisor) is orphaned when its
# raylet stops and retries the stopped GCS for Ray's gcs_rpc_server_reconnect_timeout_s (60 s by default) before it
# exits: the scancel test's launch gives up after 10 s. `_assert_ray_gone` still waits up to 60 s for every process.
_FAST_DRIVER_EXIT = {"RAY_gcs_rpc_server_reconnect_timeout_s": "10"}


def _launcher_env(tiny_model: Path, out: Path) -> dict[str, str]:
    """Settings of one launch: its own ports (not Ray's defaults, which other local clusters may hold), a short
    Ray temp dir, and a token of its own, which also marks every process of this launch's Ray cluster."""
    return {"RL_ORCH_PYTHON": sys.executable, "RL_ORCH_WORKDIR": str(REPO),
            "RL_ORCH_MODEL": str(tiny_model), "RL_ORCH_OUTPUT_DIR": str(out),
            "RL_ORCH_RAY_PORT": str(free_port()), "RL_ORCH_DASHBOARD_PORT": str(free_port()),
            "RL_ORCH_RAY_METRICS_PORT": str(free_port()),
            "RL_ORCH_RAY_START_ARGS": f"--ray-client-server-port={free_port()} "
                                      f"--dashboard-agent-listen-port={free_port()}",
            "RL_ORCH_RAY_TMPDIR": f"/tmp/rlslurm_{secrets.token_hex(4)}",
            "RAY_AUTH_TOKEN": secrets.token_hex(32), "VLLM_LOGGING_LEVEL": "WARNING"}


def _submit(cluster, tiny_model: Path, out: Path, steps: int, **extra_env: str) -> tuple[int, dict[str, str], Path]:
    env = {**_launcher_env(tiny_model, out), **extra_env}
    # the tiny run, given as script arguments; model and output dir come from RL_ORCH_MODEL / RL_ORCH_OUTPUT_DIR
    overrides = [o for o in tiny_overrides(tiny_model, out, **{"trainer.total_steps": steps})
                 if not o.startswith(("model.path=", "run.output_dir=", "checkpoint.dir="))]
    log = out / "slurm-%j.out"
    out.mkdir(parents=True)
    job = cluster.sbatch([f"--output={log}", "--nodes=1", f"--cpus-per-task={cluster.cpus}", "--gpus-per-node=0",
                          "--time=00:20:00", str(SBATCH), "configs/grpo_arith_cpu.yaml", *overrides],
                         env=env, cwd=REPO)
    return job, env, out / f"slurm-{job}.out"


def _submit_failing(cluster, tiny_model: Path, out: Path) -> tuple[int, dict[str, str], Path]:
    """A run that fails (here: a config error, found at once), launched with a `ray` whose `job logs --follow`
    prints the logs and then hangs (as a stream that outlives its job): the launcher's watcher must end it."""
    out.mkdir(parents=True)
    env = _launcher_env(tiny_model, out)
    bin_dir = out.parent / "bin"   # RL_ORCH_PYTHON's folder is where the launcher takes `ray` from
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "ray").write_text(f'#!/bin/sh\nif [ "$1 $2" = "job logs" ]; then {RAY} "$@"; exec sleep 3600; fi\n'
                                 f'exec {RAY} "$@"\n')
    for f in ("python", "ray"):
        (bin_dir / f).chmod(0o755)
    env["RL_ORCH_PYTHON"] = str(bin_dir / "python")
    job = cluster.sbatch([f"--output={out}/slurm-%j.out", f"--cpus-per-task={cluster.cpus}", "--gpus-per-node=0",
                          str(SBATCH), "configs/grpo_arith_cpu.yaml", "rollout.nn=3"], env=env, cwd=REPO)
    return job, env, out / f"slurm-{job}.out"


@pytest.fixture(scope="module")
def jobs(request, slurm_cluster, tiny_model, tmp_path_factory) -> dict[str, tuple[int, dict[str, str], Path]]:
    """{test name: (Slurm job id, its launcher env, its output file)} of this module's selected job tests, all
    submitted at once (module docstring)."""
    submit = {"test_sbatch_run_completes_with_checkpoint":
              lambda out: _submit(slurm_cluster, tiny_model, out, steps=1, RL_ORCH_PROMETHEUS_PORT=str(free_port())),
              "test_scancel_stops_the_ray_cluster":
              lambda out: _submit(slurm_cluster, tiny_model, out, steps=1000, **_FAST_DRIVER_EXIT),
              "test_failed_run_fails_the_slurm_job": lambda out: _submit_failing(slurm_cluster, tiny_model, out)}
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    return {name: fn(tmp_path_factory.mktemp(name[5:20]) / "run") for name, fn in submit.items() if name in selected}


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _ray_leftovers(env: dict[str, str]) -> list[str]:
    """Live (non-zombie) processes of this launch's Ray cluster: those whose environment holds its token,
    or whose command line names its temp dir (raylet, gcs_server, dashboard, `ray start`)."""
    token, tmpdir = env["RAY_AUTH_TOKEN"].encode(), env["RL_ORCH_RAY_TMPDIR"].encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes()
            if token in (proc / "environ").read_bytes() or tmpdir in cmdline:
                found.append(proc.name + ": " + cmdline.replace(b"\0", b" ").decode(errors="replace")[:160])
        except OSError:  # gone meanwhile
            continue
    return found


def _wait_done(cluster, job: int, env: dict[str, str], log: Path, timeout_s: float, poll_s: float = 3.0) -> dict:
    """`cluster.wait_until_done`, failing with what a hang needs to be diagnosed: the job's output, the processes
    of its Ray cluster still alive, and the Slurm daemons' logs."""
    try:
        return cluster.wait_until_done(job, timeout_s=timeout_s, poll_s=poll_s)
    except TimeoutError as e:
        pytest.fail(f"{e}\n--- job output ---\n{_read(log)[-6000:]}\n--- its Ray processes ---\n"
                    + "\n".join(_ray_leftovers(env)) + f"\n{cluster.log_tail(2000)}")


def _assert_ray_gone(env: dict[str, str], timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while (left := _ray_leftovers(env)) and time.time() < deadline:
        time.sleep(2)
    assert not left, "Ray processes left after the Slurm job ended:\n" + "\n".join(left)
    status = subprocess.run([RAY, "status", "--address", f"127.0.0.1:{env['RL_ORCH_RAY_PORT']}"],
                            env={**env, "RAY_AUTH_MODE": "token", **_FAST_GCS_GIVE_UP}, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode != 0, f"`ray status` still reaches the cluster:\n{status.stdout[-2000:]}"


@pytest.mark.timeout(900)
def test_scancel_stops_the_ray_cluster(slurm_cluster, jobs):
    """First of the three: its long run is stopped at its first step, not left training beside the others."""
    job, env, log = jobs["test_scancel_stops_the_ray_cluster"]
    out = log.parent
    # the Ray job runs once the launcher has submitted it and the run has logged its first step
    deadline = time.time() + 600
    metrics = out / "metrics.jsonl"
    while not (f"Ray job rl-orch-{job} submitted" in _read(log) and _read(metrics).strip()):
        assert time.time() < deadline, f"the run did not log a step in time:\n{_read(log)[-5000:]}"
        assert slurm_cluster.in_queue(job), f"the Slurm job ended early: {slurm_cluster.job(job)}\n{_read(log)[-5000:]}"
        time.sleep(3)
    slurm_cluster.scancel(job)
    info = _wait_done(slurm_cluster, job, env, log, timeout_s=120, poll_s=1)
    assert info["JobState"] == "CANCELLED", f"{info}\n{_read(log)[-5000:]}"
    # the launcher's trap ran to its end (stopped the Ray job and Ray) before Slurm's KillWait ran out
    assert "received a stop signal" in _read(log) and "rl_orch: exit status 143" in _read(log), _read(log)[-5000:]
    _assert_ray_gone(env)
    shutil.rmtree(env["RL_ORCH_RAY_TMPDIR"], ignore_errors=True)


@pytest.mark.timeout(900)
def test_sbatch_run_completes_with_checkpoint(slurm_cluster, jobs):
    job, env, log = jobs["test_sbatch_run_completes_with_checkpoint"]
    out = log.parent
    info = _wait_done(slurm_cluster, job, env, log, timeout_s=600)
    text = _read(log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-5000:]}"
    assert f"rl_orch: Ray job rl-orch-{job}: SUCCEEDED" in text, text[-5000:]
    assert "prom_metrics_service_discovery.json" in text, text[-5000:]
    ckpt = out / "checkpoints" / "step_000001"
    assert (ckpt / "state.json").is_file() and (ckpt / "policy" / "config.json").is_file(), text[-5000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1]
    # Prometheus file service discovery written by the head lists every node's --metrics-export-port
    sd = json.loads((Path(env["RL_ORCH_RAY_TMPDIR"]) / "prom_metrics_service_discovery.json").read_text())
    targets = [t for group in sd for t in group["targets"]]
    assert any(t.endswith(f":{env['RL_ORCH_RAY_METRICS_PORT']}") for t in targets), targets
    _assert_job_prometheus_config(job, env, out, text)
    # the join file for a second allocation's nodes (deploy/slurm/rl_orch_join.sbatch): announced, gone at the end
    join = out / f"rl_orch-{job}.join.env"
    assert f"more nodes for this run: RL_ORCH_JOIN_ENV={join} sbatch" in text, text[-5000:]
    assert not join.exists()  # it holds the cluster's token: removed with the cluster
    _assert_ray_gone(env)
    shutil.rmtree(env["RL_ORCH_RAY_TMPDIR"], ignore_errors=True)  # Ray's logs: kept where a test fails


def _assert_job_prometheus_config(job: int, env: dict[str, str], out: Path, text: str) -> None:
    """The launcher wrote this job's Prometheus config next to the run (RL_ORCH_OUTPUT_DIR), printed it and
    the command, and the config scrapes the job's discovery file and the controller on the head node at
    RL_ORCH_PROMETHEUS_PORT; `promtool check config` accepts it (alerts.yml loaded by absolute path)."""
    config = out / f"rl_orch-{job}.prometheus.yml"
    assert config.is_file(), text[-5000:]
    assert f"rl_orch: Prometheus config of this job: {config}" in text, text[-5000:]
    assert f"prometheus --config.file={config} " in text, text[-5000:]
    head_ip = re.search(r"head \S+ \(([^)]+)\)", text).group(1)
    parsed = yaml.safe_load(config.read_text())
    jobs = {j["job_name"]: j for j in parsed["scrape_configs"]}
    sd = Path(env["RL_ORCH_RAY_TMPDIR"]) / "prom_metrics_service_discovery.json"
    assert jobs["ray"]["file_sd_configs"][0]["files"] == [str(sd)]
    assert jobs["rl-orchestrator"]["static_configs"] == [{"targets": [f"{head_ip}:{env['RL_ORCH_PROMETHEUS_PORT']}"]}]
    assert parsed["rule_files"] == [str(REPO / "deploy" / "prometheus" / "alerts.yml")]
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install the Debian package prometheus (scripts/install_system_deps.sh)"
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "WARNING" not in check.stdout + check.stderr, check.stdout + check.stderr


@pytest.mark.timeout(600)
def test_failed_run_fails_the_slurm_job(slurm_cluster, jobs):
    """A run that fails (here: a config error, found at once) makes the Slurm job FAILED with exit code 1, also
    when its log stream hangs after the job ended."""
    job, env, log = jobs["test_failed_run_fails_the_slurm_job"]
    info = _wait_done(slurm_cluster, job, env, log, timeout_s=400)
    text = _read(log)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", f"{info}\n{text[-5000:]}"
    assert "unknown config key 'rollout.nn'" in text and f"Ray job rl-orch-{job}: FAILED" in text, text[-5000:]
    assert "its log stream did not; ending the stream" in text, text[-5000:]
    _assert_ray_gone(env)
    shutil.rmtree(env["RL_ORCH_RAY_TMPDIR"], ignore_errors=True)


def test_missing_binary_names_the_debian_package(monkeypatch):
    import tests.deploy.slurm_cluster as sc

    monkeypatch.setattr(sc.shutil, "which", lambda *a, **k: None)
    with pytest.raises(sc.SlurmSetupError, match=r"`munged` not found: install the Debian package munge"):
        sc.find_binary("munged")
    with pytest.raises(sc.SlurmSetupError, match=r"slurm-wlm \(slurmctld\)"):
        sc.find_binary("slurmctld")
