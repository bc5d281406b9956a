"""Run model-written Python in a subprocess under limits: the code-execution sandbox of rewards and tools.

    result = run_python("print(sum(range(10)))", SandboxLimits(cpu_s=2, wall_s=5))
    result.stdout, result.exit_code, result.timed_out, result.limit_hit   # '45\\n', 0, False, None

What one call does (docs/sandbox.md says what this prevents and what it does not):

- a fresh temporary directory (mode 0700) is the working directory, HOME and TMPDIR; it is deleted afterwards;
- the interpreter is this one, ``python -I -S`` (isolated: no PYTHON* variables, no user site, no
  site-packages, not the project's path), with a minimal environment (PATH, LANG, HOME, TMPDIR, thread caps);
- the child (`orchestrator/reward/sandbox_boot.py`) sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC
  and RLIMIT_CORE=0, then a seccomp filter refusing fork/clone/exec/socket where the platform has one;
- where ``unshare -n`` (as root) or ``unshare -rn`` (user + network namespace) works, the child runs in a
  network namespace of its own too (probed once per process);
- stdout and stderr are captured up to `output_bytes` each (the rest is read and dropped, `truncated`);
- past `wall_s` the child's process group is killed (SIGKILL).

No Ray, no threads: safe to call from a reward worker process or an environment thread.
"""
from __future__ import annotations

import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_BOOT = Path(__file__).with_name("sandbox_boot.py")
_STATUS_PREFIX = b"\x00sandbox seccomp="
_LIMIT_SIGNATURES = (("memory", "MemoryError"), ("file_size", "File too large"),
                     ("refused", "Operation not permitted"), ("refused", "Resource temporarily unavailable"),
                     ("refused", "can't start new thread"))


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one sandboxed run.

    cpu_s: CPU seconds (RLIMIT_CPU, rounded up to whole seconds; SIGXCPU at the limit, SIGKILL 1 s later).
    wall_s: wall-clock seconds before the process group is killed.
    memory_mb: address space in MiB (RLIMIT_AS): an allocation past it raises MemoryError.
    output_bytes: bytes of stdout and of stderr kept (each); more is read and dropped.
    file_mb: largest file the program may write, MiB (RLIMIT_FSIZE; a larger write fails with EFBIG).
    max_processes: RLIMIT_NPROC (counts every process of the user; not enforced for root, hence seccomp).
    isolate_network: run in a network namespace where the platform allows it.
    """

    cpu_s: float = 2.0
    wall_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 64 * 1024
    file_mb: int = 16
    max_processes: int = 0
    isolate_network: bool = True

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "output_bytes", "file_mb"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"SandboxLimits.{name}={value!r}: need a finite number > 0")
        if self.max_processes < 0:
            raise ValueError(f"SandboxLimits.max_processes={self.max_processes}: need >= 0")


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did.

    stdout/stderr: decoded (UTF-8, errors replaced), at most `output_bytes` each. exit_code: the child's
    return code (negative = killed by that signal; None only if it could not be reaped). timed_out: killed
    at `wall_s`. limit_hit: which limit ended or broke the run, best effort: "wall", "cpu", "memory",
    "file_size", "refused" (a refused fork, thread, exec or socket: EPERM/EAGAIN) or None. truncated: some output was dropped. wall_s: seconds the run took.
    network_isolated: no socket could be opened (seccomp) or the run had its own network namespace.
    processes_blocked: the seccomp filter refusing fork/clone/exec/socket was in place.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    limit_hit: str | None
    truncated: bool
    wall_s: float
    network_isolated: bool
    processes_blocked: bool

    @property
    def ok(self) -> bool:
        """Exited 0 and not killed."""
        return self.exit_code == 0 and not self.timed_out


@lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple[str, ...]:
    """The command prefix that gives a child its own network namespace here, or () where none works.

    Tries ``unshare -n`` as root, ``unshare -rn`` (a user namespace too) otherwise; probed once per process.
    """
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    prefix = (unshare, "-n") if os.geteuid() == 0 else (unshare, "-rn")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else ()


def _environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` (Python source) in a sandboxed child process; see the module docstring.

    Never raises for anything the code does (a syntax error is exit code 1 with the traceback in stderr).
    Raises OSError only when the interpreter cannot be started at all.
    """
    limits = limits or SandboxLimits()
    prefix = network_namespace_prefix() if limits.isolate_network else ()
    argv = [*prefix, sys.executable, "-I", "-S", "-c", _BOOT.read_text(), str(math.ceil(limits.cpu_s)),
            str(int(limits.memory_mb) << 20), str(int(limits.file_mb) << 20), str(limits.max_processes)]
    workdir = tempfile.mkdtemp(prefix="orch-sandbox-")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=workdir, env=_environment(workdir), start_new_session=True, close_fds=True)
        try:
            out, err, truncated, timed_out = _communicate(proc, code.encode(), limits, start)
        finally:
            _kill_group(proc)
            exit_code = _reap(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    blocked, err = _split_status(err)
    stderr = err.decode("utf-8", "replace")
    return SandboxResult(
        stdout=out.decode("utf-8", "replace"), stderr=stderr, exit_code=exit_code, timed_out=timed_out,
        limit_hit=_limit_hit(exit_code, timed_out, stderr), truncated=truncated, wall_s=time.monotonic() - start,
        network_isolated=blocked or bool(prefix), processes_blocked=blocked)


def _communicate(proc: subprocess.Popen, program: bytes, limits: SandboxLimits,
                 start: float) -> tuple[bytes, bytes, bool, bool]:
    """Send `program` on stdin, read both pipes up to the cap until EOF or the wall limit.

    Returns (stdout, stderr, truncated, timed_out)."""
    try:
        proc.stdin.write(program)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the child died before reading: its exit status and stderr say why
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    truncated = False
    with selectors.DefaultSelector() as sel:
        for pipe in kept:
            sel.register(pipe, selectors.EVENT_READ)
        while sel.get_map():
            remaining = limits.wall_s - (time.monotonic() - start)
            if remaining <= 0:
                return bytes(kept[proc.stdout]), bytes(kept[proc.stderr]), truncated, True
            for key, _ in sel.select(timeout=remaining):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                room = limits.output_bytes - len(kept[key.fileobj])
                truncated = truncated or len(chunk) > room
                kept[key.fileobj] += chunk[:max(room, 0)]
    try:
        proc.wait(timeout=max(limits.wall_s - (time.monotonic() - start), 0.01))
    except subprocess.TimeoutExpired:
        return bytes(kept[proc.stdout]), bytes(kept[proc.stderr]), truncated, True
    return bytes(kept[proc.stdout]), bytes(kept[proc.stderr]), truncated, False


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child and anything it started that stayed in the group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen) -> int | None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _split_status(err: bytes) -> tuple[bool, bytes]:
    """Strip the boot status line from stderr; return (seccomp filter in place, the rest)."""
    if not err.startswith(_STATUS_PREFIX):
        return False, err
    line, _, rest = err.partition(b"\n")
    return line[len(_STATUS_PREFIX):] == b"1", rest


def _limit_hit(exit_code: int | None, timed_out: bool, stderr: str) -> str | None:
    if timed_out:
        return "wall"
    if exit_code in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu"
    if exit_code == 0:
        return None
    tail = stderr.strip().splitlines()[-1:] or [""]
    for name, signature in _LIMIT_SIGNATURES:
        if signature in tail[0]:
            return name
    return None
