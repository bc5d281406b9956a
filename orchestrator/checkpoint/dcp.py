"""Safe reading of torch.distributed.checkpoint (DCP) folders, the `sharded/` part of an FSDP2 checkpoint.

torch's own reader unpickles `.metadata` with `pickle.load` and its default planner reads every non-tensor
item (optimizer hyperparameters) with an unrestricted `torch.load`: a crafted checkpoint could run code.
Here `.metadata` goes through an unpickler that builds only DCP's metadata classes and a few torch and
pathlib names, and non-tensor items through `torch.load(weights_only=True)`:

    dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner())

Anything else raises CheckpointError naming the file and the refused name. Imports torch; no Ray.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from orchestrator.checkpoint.manifest import CheckpointError

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
            ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
            ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes (and torch.Size, dtypes, layouts, paths) only."""

    def find_class(self, module: str, name: str) -> Any:
        if module == _METADATA_MODULE or (module, name) in _ALLOWED:
            found = super().find_class(module, name)
            if module != _METADATA_MODULE or isinstance(found, type):
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata name")


class SafeReader(FileSystemReader):
    """`FileSystemReader` whose `.metadata` is read by the allow-list unpickler above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError) as e:
            raise CheckpointError(f"{path}: refused by the safe DCP metadata reader: {e}") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` that reads non-tensor items with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise CheckpointError(f"DCP item {read_item.dest_index.fqn}: refused by the safe loader: "
                                  f"{str(e).strip().splitlines()[0]}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
