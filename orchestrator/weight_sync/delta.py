"""Exact weight deltas: XOR of bit patterns against a base version, zstd-compressed (pure torch).

After an optimizer step at an RL learning rate most bf16 weights keep their bit pattern (the update is
below half a unit in the last place), so `new XOR base` is mostly zero bytes and compresses to a
small fraction of the full set. Applying the delta (`base XOR delta`) restores `new` bit for bit; it
is lossless for any dtype (fp32 deltas just compress less). The same encoding is used by NeMo-RL's
sparse refit and slime's delta mode; this is our own implementation.

    payload = encode_delta(base, new, base_version=3, version=4)     # sender
    new2 = apply_delta(base, payload)                                # receiver: equal to `new` bitwise

Tensors are dicts name -> tensor (CPU, contiguous); both sides must hold the same names, shapes and
dtypes (a mismatch raises ValueError naming the tensor).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import torch
import zstandard

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class DeltaPayload:
    """A compressed XOR delta from `base_version` to `version`.

    data: zstd frame of the XOR bytes of every tensor, in `names` order. changed: elements whose bit
    pattern changed; numel: all elements; raw_bytes: bytes of a full sync of the same tensors.
    """

    base_version: int
    version: int
    names: list[str]
    data: bytes
    changed: int
    numel: int
    raw_bytes: int

    @property
    def changed_fraction(self) -> float:
        return self.changed / max(self.numel, 1)

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(_INT_VIEW[t.element_size()])


def _check_pair(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"tensor {name!r}: base is {tuple(a.shape)} {a.dtype}, new is {tuple(b.shape)} {b.dtype}")


def _check_names(base: dict, new: dict) -> None:
    if base.keys() != new.keys():
        raise ValueError(f"delta needs the same tensors on both sides; only in base: {sorted(base.keys() - new.keys())[:3]}, "
                         f"only in new: {sorted(new.keys() - base.keys())[:3]}")


def encode_delta(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], base_version: int, version: int,
                 level: int = 3, threads: int = -1) -> DeltaPayload:
    """XOR `new` against `base` tensor by tensor and compress with zstd `level` (`threads` -1 = all
    cores) into one frame; peak extra memory is one tensor's XOR, not the whole set."""
    _check_names(base, new)
    compressor = zstandard.ZstdCompressor(level=level, threads=threads).compressobj()
    chunks, changed, numel, raw = [], 0, 0, 0
    for name, t in new.items():
        _check_pair(name, base[name], t)
        x = torch.bitwise_xor(_bits(base[name]), _bits(t))
        changed += int(torch.count_nonzero(x))
        numel += x.numel()
        raw += x.numel() * x.element_size()
        chunks.append(compressor.compress(x.view(torch.uint8).numpy().data))
    chunks.append(compressor.flush())
    return DeltaPayload(base_version, version, list(new.keys()), b"".join(chunks), changed, numel, raw)


def apply_delta(base: dict[str, torch.Tensor], payload: DeltaPayload) -> dict[str, torch.Tensor]:
    """`base XOR delta`: the new tensors, bit for bit, decompressed tensor by tensor. Raises ValueError
    when `base` does not hold the payload's tensors or the sizes disagree (a corrupt or foreign payload)."""
    missing = [n for n in payload.names if n not in base]
    if missing:
        raise ValueError(f"delta {payload.base_version}->{payload.version} names tensors the receiver lacks: {missing[:3]}")
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload.data))
    out = {}
    for name in payload.names:
        b = base[name]
        size = b.numel() * b.element_size()
        buf = bytearray(size)
        got = reader.readinto(buf) if size else 0
        while 0 < got < size:  # readinto may return less than asked: keep filling
            n = reader.readinto(memoryview(buf)[got:])
            if n == 0:
                break
            got += n
        if got != size:
            raise ValueError(f"delta {payload.base_version}->{payload.version}: tensor {name!r} needs {size} bytes, "
                             f"the payload holds {got}: corrupt or for another model")
        x = torch.frombuffer(buf, dtype=_INT_VIEW[b.element_size()]) if size else torch.empty(0, dtype=_INT_VIEW[b.element_size()])
        out[name] = torch.bitwise_xor(_bits(b), x).view(b.dtype).view(b.shape)
    if reader.read(1):
        raise ValueError(f"delta {payload.base_version}->{payload.version}: bytes left after the last tensor")
    return out
