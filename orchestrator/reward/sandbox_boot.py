"""The sandbox's first code in the child: set the limits, refuse new processes and sockets, run the program.

Run by `orchestrator/reward/sandbox.py` as ``python -I -S -c <this file's text> CPU_S AS_BYTES FSIZE_BYTES NPROC``
with the program on stdin. Standard library only: `-I -S` gives the child no site-packages and no
project path. In order:

1. read the whole program from stdin (the program text is nowhere on disk or in the command line);
2. setrlimit: RLIMIT_CPU (soft CPU_S, hard CPU_S + 1: SIGXCPU, then SIGKILL), RLIMIT_AS, RLIMIT_FSIZE,
   RLIMIT_NPROC, RLIMIT_CORE = 0 (hard limits lowered too, so the program cannot raise them again);
3. on Linux x86-64 and aarch64, a seccomp filter (installed with ctypes, after PR_SET_NO_NEW_PRIVS) that
   makes fork, vfork, clone, clone3, execve, execveat, socket, socketpair, kill, tkill, ptrace,
   process_vm_readv/writev, pidfd_send_signal and pidfd_open fail with EPERM, and tgkill unless aimed at this
   process: no new process or thread, no new program, no socket (so no network, whatever the network
   namespace), no signal to or tracing of another process;
4. write one status line to stderr, ``\\x00sandbox seccomp=<1|0>\\n`` (the parent strips it);
5. exec the program as ``__main__`` (file name ``main.py``).
"""
import ctypes
import os
import platform
import resource
import struct
import sys

# audit arch; syscalls refused: fork vfork clone clone3 execve execveat socket socketpair, kill tkill ptrace
# process_vm_readv process_vm_writev pidfd_send_signal pidfd_open; and tgkill, allowed only on this process.
_ARCH = {
    "x86_64": (0xC000003E, (57, 58, 56, 435, 59, 322, 41, 53, 62, 200, 101, 310, 311, 424, 434), 234),
    "aarch64": (0xC00000B7, (220, 435, 221, 281, 198, 199, 129, 130, 117, 270, 271, 424, 434), 131),
}
_EPERM = 1


def _filter(audit_arch: int, refused: tuple, tgkill: int, pid: int) -> bytes:
    """The BPF program: other architectures and x32 numbers refused, the listed syscalls EPERM, tgkill only
    with this process's pid as its first argument, the rest allowed."""
    allow, deny = 0x7FFF0000, 0x00050000 | _EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    n = len(refused)  # jump offsets count the instructions skipped, up to the final `ret deny`
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, deny), (ld, 0, 0, 0), (jge, n + 4, 0, 0x40000000)]
    prog += [(jeq, n + 3 - i, 0, nr) for i, nr in enumerate(refused)]
    prog += [(jeq, 0, 2, tgkill), (ld, 0, 0, 16), (jeq, 0, 1, pid)]  # seccomp_data.args[0], low 32 bits
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def _install_seccomp() -> bool:
    """Install the filter; False where the platform has none (then only the rlimits apply)."""
    arch = _ARCH.get(platform.machine())
    if arch is None or not sys.platform.startswith("linux"):
        return False
    code = _filter(*arch, os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _main() -> None:
    cpu_s, as_bytes, fsize_bytes, nproc = (int(a) for a in sys.argv[1:5])
    source = sys.stdin.read()
    sys.stdin.close()
    for which, soft, hard in ((resource.RLIMIT_AS, as_bytes, as_bytes), (resource.RLIMIT_FSIZE, fsize_bytes, fsize_bytes),
                              (resource.RLIMIT_NPROC, nproc, nproc), (resource.RLIMIT_CORE, 0, 0),
                              (resource.RLIMIT_CPU, cpu_s, cpu_s + 1)):
        _, old_hard = resource.getrlimit(which)  # never above a hard limit the parent already set
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))
    blocked = _install_seccomp()
    sys.stderr.write(f"\x00sandbox seccomp={int(blocked)}\n")
    sys.stderr.flush()
    sys.argv = ["main.py"]
    code = compile(source, "main.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102 - the sandbox's purpose


if __name__ == "__main__":
    _main()
