"""Hardening of the local Ray a run starts itself (orchestrator/runtime/ray_connect.py `connect_ray`, called by orchestrator/job.py; a cluster is the
deployment's to secure, docs/deployment.md "Security").

Ports. Ray 2.60 takes the node's external address as its node IP on Linux even when asked for 127.0.0.1
(`ray.init` resolves a loopback `_node_ip_address` to the external one, ray/_private/services.py) and its
GCS, raylet, core workers and agents then listen on every interface (measured: 6 sockets on `::`, one on
0.0.0.0, one on the external address). A local run needs no other host, so `loopback_node_ip()` lets the
loopback address stand while the local Ray starts: every socket of its processes then listens on 127.0.0.1
(tests/integration/test_ray_security.py). `run.ray_loopback=false` keeps Ray's default.

Auth token. Ray 2.60 turns token authentication on for a new local Ray and writes ~/.ray/auth_token with the
process umask (0644 here: readable by every user of the host, and the token lets anyone who can reach a
port run code). `secure_auth_token()` writes the token file first, mode 0600 (its folder 0700 when made
here), or takes group/other permissions off an existing one of this user's.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Iterator, Mapping, Optional

LOOPBACK = "127.0.0.1"
MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


@contextlib.contextmanager
def loopback_node_ip() -> Iterator[dict]:
    """While a local Ray starts: Ray's cluster switch off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, read by
    `get_node_ip_address` at call time), so the loopback node address given to `ray.init` stands. Yields the
    `ray.init` keyword arguments to add ({"_node_ip_address": "127.0.0.1"}); the switch is restored on exit."""
    import ray._private.ray_constants as constants  # Ray's own switch; no public option in 2.60

    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield {"_node_ip_address": LOOPBACK}
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


def token_path(environ: Mapping[str, str] = os.environ) -> Optional[Path]:
    """The file Ray reads its auth token from: $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token (HOME of
    `environ`); None when $RAY_AUTH_TOKEN holds the token itself (no file)."""
    if environ.get(TOKEN_ENV):
        return None
    if environ.get(TOKEN_PATH_ENV):
        return Path(environ[TOKEN_PATH_ENV])
    return Path(environ.get("HOME") or Path.home()) / ".ray" / "auth_token"


def secure_auth_token(environ: Mapping[str, str] = os.environ) -> Optional[Path]:
    """Before a local Ray starts: make sure its auth token file is readable by this user only. Writes a new
    token (256 random bits in hex, as Ray's own generator) with mode 0600 when the file is missing and token
    authentication is not disabled ($RAY_AUTH_MODE != "disabled"); sets an existing file of this user's to
    0600 when group or others may read it. Returns the file, or None when the token comes in $RAY_AUTH_TOKEN
    (or auth is disabled and no file exists). Raises OSError naming the file when it cannot be written."""
    path = token_path(environ)
    if path is None:
        return None
    if path.exists():
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            path.chmod(0o600)
        return path
    if environ.get(MODE_ENV, "").lower() == "disabled":
        return None
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    except FileExistsError:  # another process made it meanwhile
        return secure_auth_token(environ)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path
