"""Python's cyclic garbage collector tuned for processes that import torch, transformers and vLLM (every actor, the
driver, the reward workers).

Importing them allocates millions of long-lived objects; at Python's default thresholds (700, 10, 10) the collector
runs after every 700 net allocations and its older generations keep re-walking the growing import heap: 1.3 s of a
7.0 s import of ray, torch, transformers, vLLM's LLM and the trainer actor on this project's 2-core CPU (18%;
`benchmarks/gc_thresholds.py`, benchmarks/RESULTS.md). With a first-generation threshold of 50,000 (Python's own
documentation, `gc.set_threshold`, lets programs raise it; the memory it leaves uncollected between passes is that of
at most 50,000 small objects) the import takes 5.7 s. Collections still run, and vLLM's `gc.freeze()` after its
engine starts is unaffected.

    install()   # idempotent; called by `import orchestrator` and `import actors`: leaves thresholds a program set
"""
from __future__ import annotations

import gc

PYTHON_DEFAULT = (700, 10, 10)
THRESHOLDS = (50_000, 20, 20)


def install() -> None:
    """Set THRESHOLDS when the process still has Python's default thresholds (a program's own choice is kept)."""
    if gc.get_threshold() == PYTHON_DEFAULT:
        gc.set_threshold(*THRESHOLDS)
