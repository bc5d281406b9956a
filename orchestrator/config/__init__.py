"""Run configuration: the sections composed into `Config` (`schema.py`), loading with validation (`load.py`), the
field helpers every section uses (`fields.py`).

The names below load on first use (PEP 562), so that a package's own section (orchestrator/<package>/config.py) can
import `orchestrator.config.fields` while the schema that composes the sections imports it back.
"""
from __future__ import annotations

import importlib

_NAMES = {"Config": "orchestrator.config.schema", "ConfigError": "orchestrator.config.load",
          "load_config": "orchestrator.config.load", "validate": "orchestrator.config.load"}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'orchestrator.config' has no attribute {name!r}")
