"""Leaf helpers of the whole code base, importing nothing of orchestrator/ (standard library and, for `models`,
transformers only), so that any package can use them without an import cycle:

- `atomic`: atomic folder writes (temporary folder, fsync, rename), for checkpoints and the disk weight sync;
- `finite`: the check "a finite number >= 0", for sizing, memory planning and weight-sync cost models;
- `models`: `model.path` resolved to a local HF folder, the default model prepared once
  (`python -m orchestrator.utils.models default`, run by `make model`).
"""
