"""glibc malloc settings for the actor processes (`run.glibc_tunables`).

Why: glibc hands a freed block above its mmap threshold (at most 32 MiB) back to the kernel at once, and trims
the heap's free top above 128 KiB, so a CPU training step, which allocates and frees gigabytes of activations and
gradients, takes every page of them again as a fresh, zeroed page fault on the next micro-batch. On this project's
CPU machine (a VM, where a first touch is slow) a steady step of the default model's trainer spent 1.4-4.7 s of
14-19 s in the kernel (0.7 M minor faults a step) and the first step 11-19 s of 25-37 s; with "auto" 0.2-0.3 s
of 13 s (a few dozen faults) and 9 s of 23 s (benchmarks/malloc_tunables.py, benchmarks/RESULTS.md; measured with
hugetlb=1 in "auto", 2026-12-04 00:13). How much it saves depends on the VM's state: at 08:35 the same day the
default glibc paid 0.6-1.5 s of a 14.4-15.6 s step, and "auto" (without hugetlb) was 1.01x on the steady step.

"auto" applies to CPU runs (placement.resource other than "GPU": the problem is the CPU trainer's; on a GPU node
the host heap is not on the step's path and "auto" sets nothing). It sets, for every actor process started by the
job (through Ray's runtime_env, read by glibc when the process starts; glibc >= 2.26 for tunables):

    glibc.malloc.mmap_max=0                   large blocks come from the heap, not from a fresh mmap each time
    glibc.malloc.trim_threshold=<64 GiB>      freed heap memory stays mapped for the next step (not trimmed)

Not `glibc.malloc.hugetlb=1` (transparent huge pages for the heap; in `auto` until 2026-12-04): 512x fewer faults,
but on this project's CPU VM the first touch of a huge page is far slower per byte: the trainer's warm-up took
34.0 s (23.3 s in the kernel) with it against 12.3 s (1.8 s) without, for a steady step about 2% faster
with it (14.24 s against 14.54 s, 2 steps; `benchmarks/malloc_tunables.py --warm-up --also ...`,
benchmarks/RESULTS.md, "The warm-up's heap order"). A user whose machine gains from it can add it: the setting takes any tunables string.

The cost: an actor keeps the peak of its heap mapped (its resident memory does not fall after a step), which a
training step reaches again anyway. Documented in glibc's manual, "Memory Allocation Tunables"; the same problem
is why vLLM's CPU backend and Intel's PyTorch extension recommend preloading tcmalloc or jemalloc.
"""
from __future__ import annotations

import os
import platform
import re
from typing import Mapping, Optional


ENV = "GLIBC_TUNABLES"
TRIM_THRESHOLD = 64 << 30  # bytes: never trim in practice
AUTO = ("glibc.malloc.mmap_max=0", f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}")
_ITEM = re.compile(r"^glibc\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+=[A-Za-z0-9_.,+-]+$")  # e.g. glibc.cpu.hwcaps=-AVX512F,-AVX2


def check_tunables(value: str) -> None:
    """Raise ValueError unless `value` is "auto", "none" or "" (glibc's defaults) or a GLIBC_TUNABLES string
    ("glibc.<namespace>.<name>=<value>" items joined by ":")."""
    if value in ("auto", "none", ""):
        return
    bad = [item for item in value.split(":") if not _ITEM.match(item)]
    if bad:
        raise ValueError(f"run.glibc_tunables={value!r}: {bad[0]!r} is not a glibc tunable setting; give \"auto\", "
                         "\"none\" (glibc's defaults) or items like glibc.malloc.mmap_max=0 joined by ':'")


def glibc_version(version: Optional[tuple[str, str]] = None) -> Optional[tuple[int, int]]:
    """(major, minor) of this machine's glibc, or None when the C library is not glibc (musl, macOS)."""
    lib, ver = version if version is not None else platform.libc_ver()
    if lib != "glibc" or not ver:
        return None
    major, minor = (ver.split(".") + ["0"])[:2]
    return int(major), int(minor)


def tunables_env(setting: str, environ: Mapping[str, str] = os.environ,
                 version: Optional[tuple[int, int]] = None, gpu: bool = False) -> dict[str, str]:
    """The environment variables every actor gets for `run.glibc_tunables` = `setting` ({} or {ENV: value}).

    "auto": the module docstring's settings, for glibc >= 2.26 (None or older: {}) on a CPU run (`gpu` False;
    a GPU run: {}, even with GLIBC_TUNABLES in `environ`); on a CPU run a GLIBC_TUNABLES already in the driver's
    environment is passed on instead (the user's choice). "none" or "": {} (an actor then has whatever
    GLIBC_TUNABLES its raylet's environment has: a local Ray started by the driver inherits the driver's). Any
    other value: passed on as it is. `version`: glibc's (major, minor), by default this machine's (the actors
    run on the driver's image). Raises ValueError for a malformed setting (`check_tunables`)."""
    check_tunables(setting)
    if setting in ("none", ""):
        return {}
    if setting != "auto":
        return {ENV: setting}
    if gpu:
        return {}
    if environ.get(ENV):
        return {ENV: environ[ENV]}
    version = glibc_version() if version is None else version
    if version is None or version < (2, 26):
        return {}
    return {ENV: ":".join(AUTO)}

