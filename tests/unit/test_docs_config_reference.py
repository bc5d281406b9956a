"""docs/configuration.md names every key of the run config schema, and every allowed value of a choice, so
the reference stays complete when a key is added (orchestrator/config/schema.py, the env keys in
orchestrator/envs/env_config.py).

    .venv/bin/python -m pytest tests/unit/test_docs_config_reference.py -q
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.config import schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _keys(cls, prefix=""):
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _keys(type(default), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_every_schema_key_is_in_the_reference():
    text = DOC.read_text()
    keys = list(_keys(schema.Config))
    assert len(keys) > 100 and "env.render_mode" in keys and "weight_sync.fabric.inter_node" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"docs/configuration.md does not list {missing}"


def test_every_allowed_value_is_in_the_reference():
    text = DOC.read_text()
    missing = [(k, v) for k, values in getattr(schema, "CHOICES", {}).items() for v in values if f"`{v}`" not in text]
    assert not missing, f"docs/configuration.md does not list these allowed values: {missing}"
