"""`trainer_state.pt` read with torch's safe loader only, and the RNG states it carries in a form that loader
accepts (tensors, numbers, tuples: no numpy arrays, no Python objects).

    torch.save({"optimizer": ..., "scheduler": ..., "step": 3, "rng": rng_state()}, folder / "trainer_state.pt")
    state = load_trainer_state(folder / "trainer_state.pt")     # torch.load(weights_only=True)
    set_rng_state(state["rng"])

A file the safe loader refuses (a checkpoint written before the scheduler state was plain: its LR lambda
carried an `inspect.Signature`) raises CheckpointError naming the file and why; there is no unsafe fallback.
Imports torch and numpy; no Ray, no vLLM.
"""
from __future__ import annotations

import pickle
import random
import re
from pathlib import Path

import numpy as np
import torch

from orchestrator.checkpoint.manifest import CheckpointError


def rng_state() -> dict:
    """The torch (CPU, and every CUDA device when there is one), numpy and Python RNG states."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state) -> None:
    """Restore `rng_state()`'s states; a bare tensor (checkpoints before numpy / Python states) sets torch's only."""
    if torch.is_tensor(state):
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_trainer_state(path: str | Path, mmap: bool = False) -> dict:
    """`torch.load(path, weights_only=True)` (`mmap=True`: tensors stay on disk until read). Raises CheckpointError naming the file when it is missing,
    unreadable, or holds objects the safe loader refuses (it says which and what to do)."""
    path = Path(path)
    try:
        return torch.load(path, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"it holds a {found.group(1)} object" if found else str(e).strip().splitlines()[0]
        raise CheckpointError(
            f"{path}: refused by the safe loader (torch.load weights_only=True): {what}, which could run code "
            "when loaded. Checkpoints written before rl-orchestrator saved a plain scheduler state hold such "
            "objects; a file you trust can be converted once with `python -m orchestrator.checkpoint.upgrade "
            "<folder>`, else start fresh (checkpoint.resume=none)") from None
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
