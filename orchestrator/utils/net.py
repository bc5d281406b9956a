"""Network helpers shared by the process groups (FSDP's rendezvous, the weight-sync groups)."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host now (for a rendezvous store that binds it next)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
