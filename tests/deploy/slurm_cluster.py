"""A real single-node Slurm (munged, slurmctld, slurmd) started without systemd in a temp dir, for tests.

Every daemon runs in the foreground as a subprocess of the test process, with its own config, state,
spool, socket and ports under `root`, so nothing touches /etc/slurm or /run/munge and teardown kills
exactly what was started. Client commands (sbatch, squeue, scontrol, ...) find the cluster through
`SlurmCluster.env` (SLURM_CONF). Needs the Debian packages `slurm-wlm` and `munge`
(scripts/install_system_deps.sh, `make system-deps`); a missing binary fails with the package to install.

    cluster = SlurmCluster(Path("/tmp/x")); cluster.start()
    job = cluster.sbatch(["--wrap", "hostname"]); cluster.wait_until_done(job, timeout_s=60)
    cluster.stop()
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

# binary -> the Debian package that installs it (slurm-wlm depends on slurmctld, slurmd and slurm-client)
BINARIES = {"munged": "munge", "mungekey": "munge", "slurmctld": "slurm-wlm (slurmctld)",
            "slurmd": "slurm-wlm (slurmd)", "sbatch": "slurm-wlm (slurm-client)", "squeue": "slurm-wlm (slurm-client)",
            "scontrol": "slurm-wlm (slurm-client)", "sinfo": "slurm-wlm (slurm-client)",
            "scancel": "slurm-wlm (slurm-client)", "srun": "slurm-wlm (slurm-client)"}
# states after which a job runs no more (`scontrol show job`'s JobState)
END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
              "BOOT_FAIL", "DEADLINE"}


class SlurmSetupError(RuntimeError):
    """A binary is missing or a daemon did not come up; the message says which and why."""


def find_binary(name: str) -> str:
    """Absolute path of a Slurm/munge binary (PATH, then /usr/sbin and /sbin, which a non-login PATH may lack)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")
    if path is None:
        raise SlurmSetupError(f"`{name}` not found: install the Debian package {BINARIES.get(name, 'slurm-wlm')} "
                              "(apt-get install slurm-wlm munge; `make system-deps` does it)")
    return path


def free_port() -> int:
    """A TCP port that is free now (from the kernel's ephemeral range, outside Ray's worker ports 10002-19999)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _real_memory_mb() -> int:
    """What slurmd may advertise: 90% of MemTotal (slurmd drains a node that has less than configured)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return max(1024, int(int(line.split()[1]) / 1024 * 0.9))
    return 1024


class SlurmCluster:
    """munged + slurmctld + slurmd for one node (this host), all under `root`; its one partition lets up to 4 jobs
    share a core (`OverSubscribe=FORCE:4`), so jobs that each ask for every core run side by side."""

    def __init__(self, root: Path, kill_wait_s: int = 30):
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.kill_wait_s = kill_wait_s
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket.2"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Path] = {}
        self.bin: dict[str, str] = {}

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 90.0) -> "SlurmCluster":
        self.bin = bins = {name: find_binary(name) for name in BINARIES}
        for d in ("munge", "state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o755)  # munged refuses a socket dir others cannot traverse
        key = self.root / "munge" / "munge.key"
        subprocess.run([bins["mungekey"], "--create", "--force", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o600)
        self._spawn("munged", [bins["munged"], "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged", "its socket", 20)
        self.conf.write_text(self._slurm_conf())
        self._spawn("slurmctld", [bins["slurmctld"], "-D", "-f", str(self.conf)])
        self._wait(lambda: self._run(["scontrol", "ping"]).returncode == 0, "slurmctld", "`scontrol ping`", timeout_s)
        self._spawn("slurmd", [bins["slurmd"], "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._node_idle, "slurmd", f"node {self.node} idle in `sinfo`", timeout_s)
        return self

    def stop(self) -> None:
        """Cancel every job, wait until none runs, then stop slurmd, slurmctld and munged (SIGTERM, then SIGKILL)."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            self._run(["scancel", "--user", str(os.getuid())])
            deadline = time.time() + self.kill_wait_s + 30
            while time.time() < deadline and self._run(["squeue", "--noheader"]).stdout.strip():
                time.sleep(1)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    # ---- jobs ------------------------------------------------------------------------------------------
    def sbatch(self, args: list[str], env: Optional[dict] = None, cwd: Optional[Path] = None) -> int:
        """Submit a batch job; returns its id. `env` is added to the cluster's client environment."""
        proc = self._run(["sbatch", "--parsable", *args], env=env, cwd=cwd)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as {key: value} (JobState, ExitCode, ...); {} once Slurm forgot the job."""
        proc = self._run(["scontrol", "show", "job", "--oneliner", str(job_id)])
        if proc.returncode != 0:
            return {}
        return dict(tok.split("=", 1) for tok in proc.stdout.split() if "=" in tok)

    def in_queue(self, job_id: int) -> bool:
        """Whether `squeue` still lists the job (pending, running or completing)."""
        return bool(self._run(["squeue", "--noheader", "--jobs", str(job_id)]).stdout.strip())

    def wait_until_done(self, job_id: int, timeout_s: float, poll_s: float = 3.0) -> dict[str, str]:
        """Poll until the job has ended and left the queue; returns its final `scontrol show job` record."""
        deadline = time.time() + timeout_s
        info: dict[str, str] = {}
        while time.time() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in END_STATES and not self.in_queue(job_id):
                return info
            time.sleep(poll_s)
        raise TimeoutError(f"Slurm job {job_id} not done after {timeout_s:g}s: JobState={info.get('JobState')}")

    def scancel(self, job_id: int) -> None:
        proc = self._run(["scancel", str(job_id)])
        if proc.returncode != 0:
            raise RuntimeError(f"scancel {job_id} failed: {proc.stderr.strip()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every daemon's log, for failure messages."""
        parts = []
        for name, path in self._logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {name} ({path}) ---\n{text[-chars:]}")
        return "\n".join(parts)

    # ---- internals -------------------------------------------------------------------------------------
    def _slurm_conf(self) -> str:
        r = self.root
        return f"""# single-node test cluster (tests/deploy/slurm_cluster.py)
ClusterName=rltest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=3600
KillWait={self.kill_wait_s}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={_real_memory_mb()} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = self.root / "log" / f"{name}.out"
        self._logs[name] = log
        with open(log, "ab") as out:
            self._procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                 cwd=self.root, stdin=subprocess.DEVNULL)

    def _wait(self, ready, name: str, what: str, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            proc = self._procs[name]
            if proc.poll() is not None:
                raise SlurmSetupError(f"{name} exited with {proc.returncode} before {what}:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.5)
        raise SlurmSetupError(f"{name}: no {what} after {timeout_s:g}s:\n{self.log_tail()}")

    def _node_idle(self) -> bool:
        out = self._run(["sinfo", "--noheader", "--Node", "--format=%N %t"]).stdout.split()
        return out[:2] == [self.node, "idle"]

    def _run(self, cmd: list[str], env: Optional[dict] = None,
             cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        full = [self.bin.get(cmd[0], cmd[0]), *cmd[1:]]
        return subprocess.run(full, env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True,
                              timeout=60)
