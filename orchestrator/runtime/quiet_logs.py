"""Drop one known-harmless library log line: torchao (the `fp8` extra) logs ``Failed to load .../torchao/_C_*.so``
for each of its CUDA kernel libraries when torch is a CPU build, in every process that imports it (vLLM's model
code does). The Python float8 training rl-orch uses does not need those kernels; every other torchao message passes.

    install()   # idempotent; called by `import orchestrator` and `import actors`
"""
from __future__ import annotations

import logging


class _TorchaoKernelLoad(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Failed to load") and "torchao/_C" in msg)


def install() -> None:
    """Add the filter to the "torchao" logger once."""
    logger = logging.getLogger("torchao")
    if not any(isinstance(f, _TorchaoKernelLoad) for f in logger.filters):
        logger.addFilter(_TorchaoKernelLoad())
