"""deploy/slurm/rl_orch_join.sbatch refuses what it cannot use before starting anything: outside Slurm, without
RL_ORCH_JOIN_ENV, with an unreadable file (the run ended: rl_orch.sbatch removes it), with a malformed head address
or without a token; each error names the setting. (Joining a real cluster needs a multi-node Slurm: not run here.)"""
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
