"""Worked example: a whole new weight-sync strategy in one file, plus its registry line.

"shared_file": the trainer writes each version as ONE safetensors file (no shards, no manifest) on a
path every engine can read (`<weight_sync.disk.path>/shared_file/v<version>/weights.safetensors`,
written into a temporary folder and renamed when complete); each engine streams the tensors from it;
older versions are removed once every engine was verified. Verification (version + checksums),
retries, timeouts and the `sync/*` metrics come from the shared syncer, as for every strategy.

Use it, with no file of ours changed: `weight_sync.strategy=docs.examples.weight_sync_example` (a dotted module
path: the registry imports the module and uses its `STRATEGY` and `PREDICT`). Or make it built-in by the one
registry line in orchestrator/weight_sync/registry.py (`register("shared_file", "<this module>", predict_disk)`;
the same line sits at the bottom of this file, so importing it also registers the name `shared_file`). tests/integration/test_extending_weight_sync.py runs it; the guide is
docs/extending_weight_sync.md.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from actors.weight_sync.base import WeightReceiver, WeightSender, WeightSyncStrategy
from orchestrator.utils.atomic import atomic_dir
from orchestrator.weight_sync.cost_model import predict_disk
from orchestrator.weight_sync.registry import register

FILE = "weights.safetensors"


class SharedFileSender(WeightSender):
    """Trainer side: one file per version; the payload every engine gets is its path."""

    def setup(self, ctx):
        super().setup(ctx)
        self.root = Path(ctx.options["path"])
        return {}

    def send(self, version, engine_versions):
        named, meta = self.weights_fn("cpu")  # HF names, engine dtype; meta = {"groups", "bytes"}
        with atomic_dir(self.root / f"v{version}") as tmp:
            save_file(dict(named), str(tmp / FILE), metadata={"version": str(version)})
        return str(self.root / f"v{version}" / FILE), meta

    def after_verified(self, version):
        for old in self.root.glob("v*"):
            if old.name[1:].isdigit() and int(old.name[1:]) < version:
                shutil.rmtree(old, ignore_errors=True)


class SharedFileReceiver(WeightReceiver):
    """Engine side: yields (name, tensor) from the file; raises ValueError if it holds another version."""

    def stream(self, payload, version):
        with safe_open(payload, framework="pt") as f:
            if f.metadata().get("version") != str(version):
                raise ValueError(f"{payload} holds version {f.metadata().get('version')}, expected {version}")
            for name in f.keys():
                yield name, f.get_tensor(name)


class SharedFileStrategy(WeightSyncStrategy):
    sender = SharedFileSender
    receiver = SharedFileReceiver

    def options(self, weight_sync_cfg):
        return {"path": str(Path(weight_sync_cfg.disk.path) / "shared_file")}


STRATEGY = SharedFileStrategy()

# The registry line: name, the module holding STRATEGY, the cost model's predictor (a disk write + read).
PREDICT = predict_disk  # the cost model prices it as the disk strategy (one file instead of shards)
ENTRY = register("shared_file", "docs.examples.weight_sync_example", PREDICT)
