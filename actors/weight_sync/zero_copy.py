"""Named weight tensors through the Ray object store without pickling their bytes (object-store sync).

A plain CPU `torch.Tensor` pickles in-band: torch writes its storage into a bytes object
(`torch.save` into memory), Ray copies those bytes into the object store and the reader parses them
into a fresh storage again. `SharedTensors` pickles each CPU tensor as a uint8 NumPy view of its
bytes instead; with pickle protocol 5 (what Ray uses) NumPy hands the buffer out of band, so Ray
writes it into the object store once and a reader on the same node maps it without a copy. Measured
on the default model (538 MB fp32): see benchmarks/RESULTS.md, "Where our step time goes (issue 7)".

The tensors a reader gets are views of object-store memory, read-only in spirit: copy before writing
into them (the vLLM weight loaders copy into their own parameters). Ray keeps the memory alive as long
as a view is referenced. Tensors on other devices and 0-element tensors pickle the usual way.
"""
from __future__ import annotations

import warnings

import torch


class SharedTensors(list):
    """A list of (name, torch.Tensor) pairs that pickles its CPU tensors as raw out-of-band buffers.
    Unpickles to a plain list of (name, tensor) pairs with the same names, dtypes, shapes and bits."""

    def __reduce__(self):
        return _rebuild, ([(name, _raw(t)) for name, t in self],)


def _raw(t: torch.Tensor):
    if t.device.type != "cpu" or t.numel() == 0:
        return t
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape)


def _rebuild(items: list) -> list:
    out = []
    with warnings.catch_warnings():  # object-store buffers are read-only NumPy arrays; torch warns on those
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, raw in items:
            if isinstance(raw, tuple):  # (uint8 array of the tensor's bytes, dtype name, shape)
                data, dtype, shape = raw
                raw = torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
            out.append((name, raw))
    return out
