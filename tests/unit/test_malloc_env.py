"""run.glibc_tunables (orchestrator/runtime/malloc_env.py): the environment every actor gets, its checks, and that glibc
really keeps freed memory mapped under "auto" (a child process counts its page faults)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.placement.start import run_env
from orchestrator.runtime.malloc_env import ENV, check_tunables, glibc_version, tunables_env

CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "grpo_arith_cpu.yaml"


def test_auto_keeps_freed_memory_without_huge_pages():
    for version in ((2, 36), (2, 31)):  # no glibc.malloc.hugetlb: its first touch is slow (malloc_env's docstring)
        env = tunables_env("auto", environ={}, version=version)
        assert env[ENV].split(":") == ["glibc.malloc.mmap_max=0", f"glibc.malloc.trim_threshold={64 << 30}"]


def test_auto_sets_nothing_without_glibc_tunables():
    assert tunables_env("auto", environ={}, version=(2, 17)) == {}  # tunables came with glibc 2.26
    assert glibc_version(("", "")) is None  # musl, macOS: platform.libc_ver() names no glibc
    assert glibc_version(("glibc", "2.36")) == (2, 36)


def test_the_users_own_glibc_tunables_win_over_auto():
    mine = "glibc.malloc.arena_max=2"
    assert tunables_env("auto", environ={ENV: mine}, version=(2, 36)) == {ENV: mine}


def test_empty_is_glibcs_defaults_and_a_string_is_passed_on():
    assert tunables_env("", environ={}, version=(2, 36)) == {}
    assert tunables_env("none", environ={ENV: "glibc.malloc.arena_max=2"}, version=(2, 36)) == {}
    assert load_config(CPU_YAML, ["run.glibc_tunables=none"]).run.glibc_tunables == "none"
    given = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
    assert tunables_env(given, environ={ENV: "glibc.malloc.arena_max=2"}) == {ENV: given}


@pytest.mark.parametrize("bad", ["mmap_max=0", "glibc.malloc.mmap_max", "glibc.malloc.mmap_max=0:", "yes"])
def test_a_malformed_setting_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match="run.glibc_tunables"):
        check_tunables(bad)
    with pytest.raises(ConfigError, match=r"run\.glibc_tunables"):  # (a trailing ":" fails YAML parsing first)
        load_config(CPU_YAML, [f"run.glibc_tunables={bad}"])


def test_the_default_config_uses_auto_on_every_actor():
    cfg = load_config(CPU_YAML)
    assert cfg.run.glibc_tunables == "auto"
    assert run_env(cfg) == tunables_env("auto")


def test_auto_sets_nothing_on_a_gpu_run_but_a_given_string_is_passed_on():
    assert tunables_env("auto", environ={}, version=(2, 36), gpu=True) == {}
    gpu = load_config(CPU_YAML, ["placement.resource=GPU"])
    assert run_env(gpu) == {}
    given = "glibc.malloc.arena_max=2"
    assert run_env(load_config(CPU_YAML, ["placement.resource=GPU", f"run.glibc_tunables={given}"])) == {ENV: given}


def test_values_with_signs_and_lists_are_valid_settings():
    check_tunables("glibc.cpu.hwcaps=-AVX512F,-AVX2_Usable:glibc.malloc.arena_max=2")


_FAULTS = textwrap.dedent("""
    import ctypes, resource
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    size = 64 << 20  # above glibc's largest mmap threshold (32 MiB): mmapped and unmapped each time by default
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(ctypes.c_void_p(p))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(faults[1], faults[2])
""")


def _later_faults(env: dict) -> list[int]:
    base = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", _FAULTS], env={**base, **env}, capture_output=True, text=True,
                         check=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux") or glibc_version() is None or glibc_version() < (2, 26),
                    reason="GLIBC_TUNABLES is read by glibc >= 2.26 (Linux) only")
def test_auto_stops_refaulting_a_freed_64_mib_block():
    pages = (64 << 20) // 4096
    default = _later_faults({})
    tuned = _later_faults(tunables_env("auto", environ={}))
    assert all(f > pages // 2 for f in default), default  # every malloc of it faults its pages in again
    assert all(f < pages // 100 for f in tuned), tuned  # the freed block stays mapped: reused without faults
