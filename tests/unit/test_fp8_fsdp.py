"""FP8 training under FSDP2 (trainer.num_workers > 1 with trainer.precision=fp8): actors/trainer/fp8.py converts the
linear layers before actors/model/fsdp.py shards them (torchao's order), and 2 gloo ranks, each holding half of
every weight, give the loss and gradients of one process in FP8 (torchao's dynamic scales take the amax of the whole
weight across ranks). torch.multiprocessing.spawn, tiny Llama, CPU."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from actors.trainer.fp8 import apply_fp8, count_fp8_linears
from tests.unit.trainer_helpers import save_tiny_llama

WATCH = ("model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.k_proj.weight", "model.embed_tokens.weight")


def _loss(model) -> torch.Tensor:
    ids = torch.randint(3, 97, (4, 12), generator=torch.Generator().manual_seed(7))
    logits = model(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))


def _rank(rank: int, init: str, folder: str, out: str) -> None:
    from actors.model.fsdp import shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    model = shard_model(apply_fp8(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)), 2)
    loss = _loss(model)
    loss.backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if n in WATCH}
    if rank == 0:
        torch.save({"loss": loss.detach(), "grads": grads, "fp8": count_fp8_linears(model)}, out)
    dist.destroy_process_group()


def test_two_fsdp_ranks_in_fp8_equal_one_process(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "rank0.pt"
    mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", str(folder), str(out)), nprocs=2, join=True)
    sharded = torch.load(out, weights_only=True)
    model = apply_fp8(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    loss = _loss(model)
    loss.backward()
    assert sharded["fp8"] == 14
    assert torch.allclose(sharded["loss"], loss.detach(), rtol=1e-5, atol=1e-6)
    params = dict(model.named_parameters())
    for name in WATCH:
        assert torch.allclose(sharded["grads"][name], params[name].grad, rtol=1e-4, atol=1e-6), name
