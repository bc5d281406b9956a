"""The receiving side of the collective weight sync (actors/weight_sync/collective.py `broadcast_stream`, no Ray: the
group's broadcast is replaced by a recorder): a loader that stops part-way still lets every bucket of the broadcast
arrive (the trainer and the other engines finish theirs), and the group is left only when the wire fails."""
from __future__ import annotations

import pytest
import torch

from actors.weight_sync import collective


def _fake_wire(monkeypatch, version: int, fail_at: int = -1) -> list[int]:
    """Every broadcast call recorded (its element count); the header carries `version` and the plan of `layout`;
    call `fail_at` raises as a lost member would."""
    calls: list[int] = []

    def broadcast(tensor, group):
        if len(calls) == fail_at:
            raise RuntimeError("gloo: connection closed by peer")
        calls.append(tensor.numel())
        if len(calls) == 1:  # the header [version, buckets, elements]
            tensor.copy_(torch.tensor(HEADER[version]))
        else:
            tensor.fill_(1.0)

    monkeypatch.setattr(collective.collective_group, "broadcast", broadcast)
    return calls


LAYOUT = [(f"layer{i}.weight", (256, 256), torch.float32) for i in range(4)]  # 256 KiB each: one bucket each
HEADER = {3: [3, 4, 4 * 256 * 256]}


class Loader:
    """Takes `take` tensors, then raises (a tensor the model cannot load)."""

    def __init__(self, take: int):
        self.take, self.got = take, []

    def __call__(self, pairs):
        for name, tensor in pairs:
            if len(self.got) == self.take:
                raise ValueError(f"cannot load {name}")
            self.got.append(name)


def _receiver() -> collective.CollectiveReceiver:
    receiver = collective.CollectiveReceiver()
    receiver.group = ("g", LAYOUT, 0.25, "cpu")
    return receiver


def test_a_loader_that_stops_part_way_lets_the_whole_broadcast_arrive_and_stays_in_the_group(monkeypatch):
    calls = _fake_wire(monkeypatch, 3)
    receiver, loader = _receiver(), Loader(take=1)
    with pytest.raises(ValueError, match="cannot load layer1.weight"):
        receiver.receive(None, 3, loader)
    assert calls == [3] + [256 * 256] * 4  # the header and every bucket: the sender's broadcast completed
    assert loader.got == ["layer0.weight"] and receiver.group is not None  # the group is whole: not left


def test_a_whole_load_reads_every_tensor_and_a_failed_wire_leaves_the_group(monkeypatch):
    _fake_wire(monkeypatch, 3)
    receiver, loader = _receiver(), Loader(take=99)
    receiver.receive(None, 3, loader)
    assert loader.got == [name for name, _, _ in LAYOUT]
    calls = _fake_wire(monkeypatch, 3, fail_at=2)  # the second bucket: a member was lost
    left = []
    monkeypatch.setattr(collective.collective_group, "leave_group", left.append)
    with pytest.raises(RuntimeError, match="connection closed"):
        receiver.receive(None, 3, Loader(take=99))
    assert len(calls) == 2 and left == ["g"] and receiver.group is None  # left at once: the others fail, not hang
