"""deploy/slurm/rl_orch_join.sbatch refuses what it cannot use before starting anything: outside Slurm, without
RL_ORCH_JOIN_ENV, with an unreadable file (the run ended: rl_orch.sbatch removes it), with a malformed head address
or without a token, with a drain deadline that is not whole seconds; each error names the setting. Its leaving:
USR1 (the time-limit notice) drains the allocation's nodes with `rl-orch drain`, with stand-ins for srun and the
python. (Joining a real cluster needs a multi-node Slurm: not run here.)"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "rl_orch_join.sbatch"


def _run(env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RL_ORCH_"))}
    return subprocess.run(["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("content, match", [
    (None, "RL_ORCH_JOIN_ENV=.* cannot be read"),
    ("RL_ORCH_HEAD=10.0.0.1\nRAY_AUTH_TOKEN=abc\n", "RL_ORCH_HEAD must be <ip>:<port>"),
    ("RL_ORCH_HEAD=10.0.0.1:6379\n", "no RAY_AUTH_TOKEN"),
])
def test_the_join_script_refuses_a_bad_join_file_naming_it(tmp_path, content, match):
    path = tmp_path / "rl_orch-1.join.env"
    if content is not None:
        path.write_text(content)
    r = _run({"SLURM_JOB_ID": "7", "RL_ORCH_JOIN_ENV": str(path)})
    assert r.returncode == 1 and re.search(match, r.stderr), r.stderr


def test_the_join_script_needs_slurm_and_the_join_file():
    r = _run({})
    assert r.returncode == 1 and "not inside a Slurm allocation" in r.stderr
    r = _run({"SLURM_JOB_ID": "7"})
    assert r.returncode == 1 and "set RL_ORCH_JOIN_ENV" in r.stderr


def test_a_bad_drain_deadline_is_refused(tmp_path):
    path = tmp_path / "rl_orch-1.join.env"
    path.write_text("RL_ORCH_HEAD=10.0.0.1:6379\nRAY_AUTH_TOKEN=abc\n")
    r = _run({"SLURM_JOB_ID": "7", "RL_ORCH_JOIN_ENV": str(path), "RL_ORCH_DRAIN_S": "5m"})
    assert r.returncode == 1 and "RL_ORCH_DRAIN_S must be a whole number of seconds" in r.stderr, r.stderr


def test_usr1_drains_the_allocations_nodes_and_the_job_ends_when_its_raylets_do(tmp_path):
    """Slurm's time-limit notice (USR1, `--signal=B:USR1@300`, or `scancel --batch --signal=USR1`): the script runs
    `rl-orch drain` for every node of its allocation with the deadline, and keeps waiting for its `ray start` step,
    which ends when the raylets exit (once idle); then it exits 0. With stand-ins for srun, scontrol and the python:
    each logs its arguments; the step ends when the test removes its file."""
    import signal
    import time

    bin_dir, log, step = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "step-running"
    bin_dir.mkdir()
    step.touch()
    fakes = {"scontrol": "echo node17; echo node18",
             "srun": f'echo "srun $*" >> {log}; while [ -e {step} ]; do sleep 0.1; done',
             "python": f'echo "python $*" >> {log}', "ray": "exit 0"}
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    join = tmp_path / "rl_orch-1.join.env"
    join.write_text("RL_ORCH_HEAD=10.0.0.1:6379\nRAY_AUTH_TOKEN=abc\nRL_ORCH_HEAD_JOB=1\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RL_ORCH_"))}
    env = {**base, "PATH": f"{bin_dir}:{base['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[17-18]",
           "RL_ORCH_JOIN_ENV": str(join), "RL_ORCH_PYTHON": str(bin_dir / "python"), "RL_ORCH_DRAIN_S": "120"}
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 20
        while not (log.exists() and "srun" in log.read_text()):
            assert time.time() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() else "no srun"
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR1)
        while "python -m orchestrator drain" not in log.read_text():
            assert time.time() < deadline, log.read_text()
            time.sleep(0.1)
        assert proc.poll() is None  # still waiting for its step: the raylets leave once idle
        step.unlink()  # the raylets exit
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    drain = [line for line in log.read_text().splitlines() if line.startswith("python")]
    assert drain == ["python -m orchestrator drain --address 10.0.0.1:6379 --deadline-s 120 --reason-message Slurm "
                     "job 7 ends --host node17 --host node18"], drain
    assert proc.returncode == 0 and "draining node17 node18 (deadline 120 s)" in out, out
