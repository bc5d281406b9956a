"""The checkpoint a run resumes from, checked before any actor starts, and the line the resume prints.

    folder = resume_checkpoint(cfg.checkpoint, model_path, cfg.model.path)   # None: a fresh start
    print(resume_line(folder, step=10, total_steps=100))

Imports torch (the safe-load check of a checkpoint written before manifests); no Ray, no vLLM.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from orchestrator.checkpoint.compat import check_same_model
from orchestrator.checkpoint.folders import find_checkpoint
from orchestrator.checkpoint.manifest import read_manifest
from orchestrator.checkpoint.state import load_trainer_state


def resume_checkpoint(checkpoint_cfg, model_path: Path, configured_model: str) -> Optional[Path]:
    """The folder `checkpoint.resume` names (`find_checkpoint`: verified against its manifest), None for a fresh
    start. Raises ValueError (naming both models and the first field that differs) when it holds another model
    than `model_path` (the resolved `model.path=configured_model`); CheckpointError when a path does not verify
    or, for a checkpoint without a manifest, when its trainer_state.pt cannot be read with the safe loader;
    FileNotFoundError when a path is not a checkpoint."""
    folder = find_checkpoint(checkpoint_cfg.resume, checkpoint_cfg.dir)
    if folder is None:
        return None
    manifest = read_manifest(folder)
    check_same_model(folder, manifest, model_path, configured_model)
    if manifest is None:  # written before manifests: refuse an unsafe trainer_state.pt now, not in the trainer
        load_trainer_state(folder / "trainer_state.pt", mmap=True)
    return folder


def resume_line(folder: Path, step: int, total_steps: int) -> str:
    """"resume: loaded checkpoint <folder> (after step k); continuing at step k+1 of N" (or nothing left)."""
    if step >= total_steps:
        return (f"resume: loaded checkpoint {folder} (after step {step}); trainer.total_steps={total_steps} is "
                "reached, nothing left to train (a new run: checkpoint.resume=none or another checkpoint.dir)")
    return f"resume: loaded checkpoint {folder} (after step {step}); continuing at step {step + 1} of {total_steps}"
