"""The generated-but-untrained batches of `rollout.mode=one_step_off`, as checkpoint data.

At the checkpoint of step k the batch of step k + 1 has already been generated, by the weights of
version k - 1 (one step off-policy). Those weights are gone by then (trainer and engines hold version
k), so a resume cannot regenerate that batch as it was; the checkpoint keeps the batch itself, and the
resumed run trains on exactly the samples the uninterrupted run trained on (exact resume).

    text = pack([batch_to_dict(step, weight_version, loader_state, launched), ...])
    for b in unpack(text): ...  # dicts with PromptRequest and Trajectory objects again

`pack` writes compact JSON, zlib-compressed and base64-encoded (one short line in state.json); floats
round-trip exactly through JSON (repr). `unpack` only decodes JSON: nothing in it is executed. Pure
(no Ray, no torch).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import zlib
from typing import Any

from orchestrator.rollout.types import MultiTurnInfo, PromptRequest, SamplingOverride, Trajectory


def trajectory_to_dict(t: Trajectory) -> dict:
    """A JSON-ready dict of `t` (its `multiturn` info as a nested dict or None)."""
    return dataclasses.asdict(t)


def trajectory_from_dict(d: dict) -> Trajectory:
    """The `Trajectory` of `trajectory_to_dict`. Raises TypeError / KeyError on a malformed dict."""
    d = dict(d)
    info = d.pop("multiturn", None)
    return Trajectory(**d, multiturn=MultiTurnInfo(**info) if info is not None else None)


def prompt_request_from_dict(d: dict) -> PromptRequest:
    """The PromptRequest of `dataclasses.asdict(request)` (its sampling override rebuilt)."""
    d = dict(d)
    sampling = d.pop("sampling", None)
    return PromptRequest(**d, sampling=SamplingOverride(**sampling) if sampling is not None else None)


def batch_to_dict(step: int, weight_version: int, loader_state: dict, launched) -> dict:
    """One pending batch: its training step, the engines' weight version that generated it, the loader state
    before its prompts were sampled, and of its `Launched` (orchestrator/rollout/source.py) the requests,
    the workers called, `meta`, and the workers' results [(trajectories, metrics)]."""
    results = launched.results
    return {"step": int(step), "weight_version": int(weight_version), "loader_state": loader_state,
            "requests": [dataclasses.asdict(r) for r in launched.requests], "workers": list(launched.workers),
            "meta": dict(launched.meta),
            "results": [[[trajectory_to_dict(t) for t in trajs], dict(metrics)] for trajs, metrics in results]}


def batch_from_dict(d: dict) -> dict:
    """`batch_to_dict`'s dict with PromptRequest and Trajectory objects again (results as (list, dict) tuples)."""
    return {**d, "requests": [prompt_request_from_dict(r) for r in d["requests"]],
            "results": [([trajectory_from_dict(t) for t in trajs], dict(m)) for trajs, m in d["results"]]}


def pack(batches: list[dict]) -> str:
    """base64(zlib(compact JSON)) of `batches` (dicts of `batch_to_dict`). Raises TypeError when a
    trajectory's `extra` holds something JSON cannot represent."""
    return pack_json(batches)


def unpack(text: str) -> list[dict]:
    """The batches of `pack`, with objects rebuilt (`batch_from_dict`). Raises ValueError on corrupt text."""
    return [batch_from_dict(b) for b in unpack_json(text, "the pending async batches")]


def pack_json(value: Any) -> str:
    """base64(zlib(compact JSON)) of any JSON-serialisable `value` (one short ASCII line in state.json; floats
    round-trip exactly). Raises TypeError for what JSON cannot represent."""
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack_json(text: str, what: str) -> Any:
    """The value of `pack_json` (only JSON is decoded: nothing in it is executed). Raises ValueError naming
    `what` on corrupt text."""
    try:
        return json.loads(zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True)))
    except (ValueError, zlib.error) as e:
        raise ValueError(f"checkpoint: {what} cannot be decoded ({e})") from None
