"""Object-store weight sync: the named tensors go into the Ray object store once; every engine reads them.

The trainer returns its tensors as `SharedTensors` (raw out-of-band buffers, actors/weight_sync/
zero_copy.py); Ray stores them once and each engine on the node maps them without a copy.
"""
from __future__ import annotations

from actors.weight_sync.base import WeightReceiver, WeightSender, WeightSyncStrategy


class ObjectStoreSender(WeightSender):
    """The payload is the trainer's named tensors themselves."""

    def send(self, version, engine_versions):
        return self.weights_fn("cpu")


class ObjectStoreReceiver(WeightReceiver):
    """The payload (resolved by Ray) is already the list of (HF name, tensor)."""

    def stream(self, payload, version):
        return payload


class ObjectStoreStrategy(WeightSyncStrategy):
    sender = ObjectStoreSender
    receiver = ObjectStoreReceiver


STRATEGY = ObjectStoreStrategy()
