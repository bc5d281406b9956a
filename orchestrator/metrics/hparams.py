"""The run config as hyper-parameters for the trackers, with secrets left out. Pure (standard library only).

    env_sourced_keys(raw)       # dotted keys whose value comes from the environment (${oc.env:NAME}), before resolving
    flat_hparams(resolved, redact=["metrics.wandb"])   # {"trainer.lr": 2e-05, "metrics.wandb.entity": "<redacted>", ...}

A value is redacted (REDACTED) when its key, or any section above it, is named like a secret (a part of the name
separated by "_" is one of SECRET_WORDS: `api_key`, `hf_token`, `password`; never `max_new_tokens`), or when the
key or a section above it is in `redact` (`metrics.redact`: load_config adds every key set from the environment).
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

REDACTED = "<redacted>"
SECRET_WORDS = ("key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials", "auth")
_SECRET = re.compile(r"(^|_)(" + "|".join(SECRET_WORDS) + r")($|_)", re.IGNORECASE)
_ENV = re.compile(r"\$\{\s*(oc\.env|env)\s*:")
_REF = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*\}")


def _leaves(node: Any, prefix: str = ""):
    """(dotted key, value) of every leaf; list items are keyed by index (`reward.functions.0.name`)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(node, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in node):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], node


def env_sourced_keys(raw: dict) -> set[str]:
    """Dotted keys of `raw` (a config as plain containers, interpolations NOT resolved) whose value comes from
    the environment: a string holding `${oc.env:...}`, or interpolating such a key (`${metrics.wandb.entity}`)."""
    strings = {k: v if isinstance(v, str) else json.dumps(v) for k, v in _leaves(raw) if isinstance(v, (str, list, tuple))}
    found = {k for k, v in strings.items() if _ENV.search(v)}
    while True:  # keys that interpolate an env-sourced key, until nothing new
        more = {k for k, v in strings.items() if k not in found
                and any(ref == f or ref.startswith(f + ".") or f.startswith(ref + ".") for ref in _REF.findall(v)
                        for f in found)}
        if not more:
            return found
        found |= more


def is_secret(key: str, redact: Iterable[str] = ()) -> bool:
    """Whether dotted `key` is left out: a part named like a secret, or `key` / a section above it in `redact`."""
    if any(_SECRET.search(part) for part in key.split(".")):
        return True
    return any(key == r or key.startswith(r + ".") for r in redact)


def flat_hparams(resolved: dict, redact: Iterable[str] = ()) -> dict[str, Any]:
    """`resolved` (the run config as plain containers) flattened to {dotted key: value}; values are str, int,
    float, bool or None (a list of scalars as its JSON text); secrets (`is_secret`) replaced by REDACTED."""
    redact = list(redact)
    out = {}
    for key, value in _leaves(resolved):
        if is_secret(key, redact):
            value = REDACTED
        elif isinstance(value, (list, tuple)):
            value = json.dumps(list(value))
        out[key] = value
    return out
