"""The code sandbox enforces its limits for real: every test runs a child Python under them."""
from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from orchestrator.reward.sandbox import SandboxLimits, network_namespace_prefix, run_python

FAST = SandboxLimits(cpu_s=1, wall_s=20, memory_mb=256, output_bytes=4096, file_mb=1)


def test_plain_program_runs_and_reports():
    result = run_python("import math\nprint(math.factorial(5))", FAST)
    assert result.ok and result.stdout == "120\n" and result.stderr == ""
    assert result.limit_hit is None and not result.truncated and not result.timed_out
    assert 0 < result.wall_s < FAST.wall_s


def test_infinite_loop_is_killed_at_the_cpu_limit():
    result = run_python("while True:\n    pass", SandboxLimits(cpu_s=1, wall_s=30))
    assert result.exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
    assert result.limit_hit == "cpu" and not result.timed_out
    assert result.wall_s < 30


def test_sleeping_program_is_killed_at_the_wall_limit():
    result = run_python("import time\ntime.sleep(3600)", SandboxLimits(cpu_s=5, wall_s=1.0))
    assert result.timed_out and result.limit_hit == "wall" and result.exit_code == -signal.SIGKILL
    assert result.wall_s < 10  # killed at 1 s (plus start-up on a loaded machine), not after an hour


def test_two_and_thirty_gib_allocations_fail_under_the_memory_limit():
    for gib in (2, 30):
        result = run_python(f"buf = bytearray({gib} << 30)\nprint('allocated')", FAST)
        assert result.exit_code == 1 and "allocated" not in result.stdout
        assert result.limit_hit == "memory" and "MemoryError" in result.stderr


def test_huge_print_is_truncated_and_the_run_ends():
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)"  # 1 GiB
    result = run_python(code, SandboxLimits(cpu_s=2, wall_s=20, output_bytes=4096))
    assert result.truncated and len(result.stdout) == 4096 and set(result.stdout) == {"x"}
    assert result.wall_s < 25


def test_writes_land_in_a_temp_dir_that_is_removed_and_file_size_is_capped():
    code = ("import os\nopen('note.txt', 'w').write('hello')\nprint(os.getcwd())\nprint(os.environ['HOME'])\n"
            "print(sorted(os.listdir('.')))")
    result = run_python(code, FAST)
    workdir, home, listing = result.stdout.splitlines()
    assert result.ok and home == workdir and listing == "['note.txt']"
    assert Path(workdir).parent == Path(tempfile.gettempdir()) and Path(workdir).name.startswith("orch-sandbox-")
    assert not Path(workdir).exists()  # deleted afterwards, with what the program wrote
    big = run_python("open('big.bin', 'wb').write(b'x' * (4 << 20))", FAST)  # 4 MiB > file_mb=1
    assert big.exit_code == 1 and big.limit_hit == "file_size"


def test_fork_and_fork_bomb_are_refused():
    probe = run_python("import os\npid = os.fork()\nprint('forked', pid)", FAST)  # at most one child if unblocked
    assert probe.processes_blocked and "forked" not in probe.stdout and probe.limit_hit == "refused"
    bomb = run_python("import os\nwhile True:\n    os.fork()", FAST)
    assert bomb.exit_code == 1 and "PermissionError" in bomb.stderr and bomb.wall_s < FAST.wall_s
    for code in ("import subprocess\nsubprocess.run(['true'])", "import os\nos.execv('/bin/true', ['true'])",
                 "import threading\nthreading.Thread(target=print).start()"):
        result = run_python(code, FAST)
        assert result.exit_code == 1 and result.limit_hit == "refused", (code, result.stderr)


def test_no_socket_and_no_network():
    result = run_python("import socket\ns = socket.create_connection(('127.0.0.1', 9), timeout=1)", FAST)
    assert result.exit_code == 1 and result.network_isolated
    assert "PermissionError" in result.stderr  # socket() itself is refused by the seccomp filter
    assert network_namespace_prefix() == () or network_namespace_prefix()[-1] in ("-n", "-rn")


def test_environment_is_minimal_and_isolated_mode():
    code = "import os, sys\nprint(sorted(os.environ))\nprint(sys.flags.isolated, sys.flags.no_site)"
    os.environ["ORCH_SANDBOX_SECRET"] = "x"
    try:
        result = run_python(code, FAST)
    finally:
        del os.environ["ORCH_SANDBOX_SECRET"]
    env_keys, flags = result.stdout.splitlines()
    assert "ORCH_SANDBOX_SECRET" not in env_keys and "PYTHONPATH" not in env_keys
    assert flags == "1 1"


def test_syntax_error_is_an_exit_code_not_an_exception():
    result = run_python("def f(:\n", FAST)
    assert result.exit_code == 1 and "SyntaxError" in result.stderr and result.limit_hit is None


def test_no_signal_to_another_process_but_its_own_signals_work():
    for code in ("import os\nos.kill(os.getppid(), 0)", "import os\nos.kill(-1, 0)"):  # signal 0: a harmless probe
        result = run_python(code, FAST)
        assert result.exit_code == 1 and result.limit_hit == "refused", (code, result.stderr)
    own = run_python("import signal\nsignal.raise_signal(signal.SIGTERM)", FAST)  # tgkill on itself is allowed
    assert own.exit_code == -signal.SIGTERM
