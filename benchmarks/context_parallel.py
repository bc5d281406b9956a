"""Context parallelism on CPU (gloo): the activation bytes a rank keeps for the backward, and the step time, with
c = 1 (one process, SDPA) and c = 2 (two processes, ring attention, actors/model/context_parallel.py) on one
packed row of L tokens, for a random SmolLM2-135M-shaped Llama with `--layers` decoder layers, fp32.

    python benchmarks/context_parallel.py --seq-len 2048 --layers 4

"saved" = bytes of the distinct tensors autograd saves for the backward during the forward (torch's
saved_tensors_hooks; parameters excluded), the activation memory a rank holds at the loss; it is what c divides.
Prints one JSON line per c.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from actors.model.forward import collate_packed, forward_logprobs  # noqa: E402


def build_model(layers: int, impl=None):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    if impl is not None:
        cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg)


def packed_row(seq_len: int):
    g = torch.Generator().manual_seed(1)
    half = seq_len // 2  # two sequences of L/2: prompt 64 tokens, response the rest
    ids = [torch.randint(3, 49152, (half,), generator=g).tolist() for _ in range(2)]
    return collate_packed([x[:64] for x in ids], [x[64:] for x in ids])


def _measure(fn) -> dict:
    """Run fn() (returns a scalar loss) under saved_tensors_hooks, then backward; bytes saved and seconds."""
    params = set()
    seen: dict = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(params)
    t1 = time.perf_counter()
    loss.backward()
    return {"saved_MiB": round(sum(seen.values()) / 2**20, 1), "forward_s": round(t1 - t0, 2),
            "backward_s": round(time.perf_counter() - t1, 2)}


def _single(args) -> dict:
    model = build_model(args.layers)
    mb = packed_row(args.seq_len)

    def fn(params):
        params.update(p.data_ptr() for p in model.parameters())
        return forward_logprobs(model, mb, 1.0).sum()

    return _measure(fn)


def _rank(rank: int, init: str, args, out: str) -> None:
    from actors.model.context_parallel import RING_ATTENTION, cp_forward_logprobs

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    model = build_model(args.layers, RING_ATTENTION)
    mb = packed_row(args.seq_len)

    def fn(params):
        params.update(p.data_ptr() for p in model.parameters())
        return cp_forward_logprobs(model, mb, 1.0).sum()

    result = _measure(fn)
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"c": 1, "seq_len": args.seq_len, "layers": args.layers, **_single(args)}), flush=True)
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(f"file://{out}/rendezvous", args, out), nprocs=2, join=True)
        for r in range(2):
            with open(f"{out}/{r}.json") as f:
                print(json.dumps({"c": 2, "rank": r, "seq_len": args.seq_len, "layers": args.layers,
                                  **json.load(f)}), flush=True)


if __name__ == "__main__":
    main()
