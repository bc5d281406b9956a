"""Is a checkpoint of the configured model? The model identity of an HF `config.json` and the refusal of a
checkpoint whose identity differs, naming both sides and the first field that differs.

    identity = model_identity("/models/x/config.json")   # {"architectures": ["LlamaForCausalLM"], ...}
    check_same_model(ckpt_folder, model_path, "models/x") # raises ValueError for another model's checkpoint

Pure (standard library only).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

# the config fields that decide the shapes and meaning of the weights (a state dict of a model that differs
# in any of them does not load, or loads into the wrong architecture)
IDENTITY_FIELDS = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim",
                   "tie_word_embeddings", "num_local_experts", "num_experts", "moe_intermediate_size")


def model_identity(config_json: str | os.PathLike) -> dict:
    """The IDENTITY_FIELDS present in an HF `config.json` ({} for a file without any of them).
    Raises FileNotFoundError when the file is missing, ValueError when it is not JSON."""
    path = Path(config_json)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    return {k: config[k] for k in IDENTITY_FIELDS if k in config}


def first_difference(a: dict, b: dict) -> Optional[tuple[str, object, object]]:
    """The first IDENTITY_FIELDS key (in that order) whose value differs between two identities, as
    (key, a's value, b's value), a missing key read as None; None when they agree."""
    for key in IDENTITY_FIELDS:
        if a.get(key) != b.get(key):
            return key, a.get(key), b.get(key)
    return None


def describe(identity: dict) -> str:
    """A short name for an identity: "LlamaForCausalLM, hidden_size 576, 30 layers, vocab 49152"."""
    arch = ",".join(identity.get("architectures") or [identity.get("model_type") or "unknown architecture"])
    return (f"{arch}, hidden_size {identity.get('hidden_size')}, {identity.get('num_hidden_layers')} layers, "
            f"vocab {identity.get('vocab_size')}")


def checkpoint_identity(folder: Path, manifest: Optional[dict]) -> tuple[dict, str]:
    """(identity, base model path or "") of a checkpoint: from its manifest, else from `policy/config.json`
    (a checkpoint written before manifests)."""
    if manifest is not None and isinstance(manifest.get("model"), dict):
        return dict(manifest["model"].get("identity") or {}), str(manifest["model"].get("base_path", ""))
    return model_identity(folder / "policy" / "config.json"), ""


def check_same_model(folder: Path, manifest: Optional[dict], model_path: Path, configured: str) -> None:
    """Raise ValueError unless checkpoint `folder` holds the model at `model_path` (the resolved
    `model.path=configured`): the message names the checkpoint and its model, `model.path` and its model,
    and the first field that differs."""
    ours = model_identity(Path(model_path) / "config.json")
    theirs, base = checkpoint_identity(folder, manifest)
    diff = first_difference(theirs, ours)
    if diff is None:
        return
    key, a, b = diff
    written = f" (trained from {base})" if base else ""
    raise ValueError(f"checkpoint {folder} holds another model than model.path={configured!r}: the checkpoint's is "
                     f"{describe(theirs)}{written}; model.path ({model_path}) is {describe(ours)}; first difference: "
                     f"{key} = {a!r} in the checkpoint, {b!r} in model.path. Resume it with the model it was "
                     "trained from, or start this model fresh (checkpoint.resume=none, or another checkpoint.dir)")
