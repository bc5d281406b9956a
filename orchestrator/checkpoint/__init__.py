"""Checkpoints: folders and the choice of the one to resume (folders.py), the manifest written last and its
verification (manifest.py), the model-identity check (compat.py), when to write one (schedule.py) and the
trainer state read with safe loaders only (state.py, imports torch: import it by its module path).
Pure: no Ray, no vLLM."""
from orchestrator.checkpoint.compat import check_same_model, model_identity
from orchestrator.checkpoint.folders import (REQUIRED, CheckpointWarning, find_checkpoint, is_complete,
                                             list_checkpoints, prune_checkpoints, restart_checkpoint, step_folder,
                                             step_folders)
from orchestrator.checkpoint.manifest import (FORMAT_VERSION, MANIFEST, CheckpointError, read_manifest,
                                              verify_manifest, write_manifest)
from orchestrator.checkpoint.schedule import checkpoint_due

__all__ = ["REQUIRED", "MANIFEST", "FORMAT_VERSION", "CheckpointError", "CheckpointWarning", "check_same_model",
           "checkpoint_due", "find_checkpoint", "is_complete", "list_checkpoints", "model_identity",
           "prune_checkpoints", "read_manifest", "restart_checkpoint", "step_folder", "step_folders", "verify_manifest", "write_manifest"]
