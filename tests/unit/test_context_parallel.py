"""Context parallelism in the trainer's forward (actors/model/context_parallel.py), 2 gloo ranks
(torch.multiprocessing.spawn), a tiny Llama in fp32: the logprobs, the policy loss and every parameter gradient
(summed over the 2 ranks) equal the un-split forward's (c = 1, SDPA), for a padded micro-batch and for packed rows
whose sequences straddle the chunk boundaries, with and without gradient checkpointing, and with the entropy
bonus (the gathered entropy's gradient); outside a context-parallel forward the ring-loaded model equals SDPA."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from actors.model.forward import collate, collate_packed, forward_logprobs
from orchestrator.algo import EntropySink, LossInputs, compute_policy_loss
from orchestrator.config.schema import AlgoConfig
from tests.unit.trainer_helpers import random_batch, save_tiny_llama

C = 2
# (packed, gradient checkpointing); packed: 4 sequences (7, 7, 6, 9 tokens) in one row
CASES = ((False, False), (True, False), (True, True))


def _micro_batch(packed: bool):
    batch = random_batch(4, seed=5)
    per_token = {"adv": [[a] * len(r) for a, r in zip([1.0, -1.0, 0.5, -0.5], batch.response_ids)],
                 "old": [[-4.0] * len(r) for r in batch.response_ids]}
    make = collate_packed if packed else collate
    return make(batch.prompt_ids, batch.response_ids, per_token)


def _loss(lp, mb, entropy):
    algo = AlgoConfig(entropy_coef=0.01)
    norm = float(mb.mask.sum())
    inputs = LossInputs(lp, mb.values["old"], mb.values["adv"], mb.mask, norm, 8, entropy=entropy)
    return compute_policy_loss(inputs, algo)[0]


def _load(folder, impl=None):
    kwargs = {} if impl is None else {"attn_implementation": impl}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
    model.train()
    return model


def _rank(rank: int, init: str, folder: str, out_dir: str) -> None:
    from actors.model.context_parallel import RING_ATTENTION, cp_forward_logprobs

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=C)
    try:
        for packed, checkpointing in CASES:
            model = _load(folder, RING_ATTENTION)
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            mb = _micro_batch(packed)
            sink = EntropySink(grad=True)
            lp = cp_forward_logprobs(model, mb, 0.7, group=None, entropy=sink)
            loss = _loss(lp, mb, sink.value)
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            for g in grads.values():
                dist.all_reduce(g)  # each rank holds its tokens' share of the gradient
            torch.save({"lp": lp.detach(), "loss": loss.detach(), "grads": grads},
                       f"{out_dir}/cp_{int(packed)}{int(checkpointing)}_{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = save_tiny_llama(tmp_path_factory.mktemp("tiny"))
    out = tmp_path_factory.mktemp("cp")
    mp.spawn(_rank, args=(f"file://{out}/rendezvous", str(folder), str(out)), nprocs=C, join=True)
    return folder, out


@pytest.mark.parametrize("packed, checkpointing", CASES)
def test_two_context_parallel_ranks_equal_one(run, packed, checkpointing):
    folder, out = run
    mb = _micro_batch(packed)
    if packed:  # 29 tokens padded to 32: the 2c = 4 chunks cut through sequences (no cut at a sequence start)
        starts = set(torch.nonzero(mb.position_ids[0] == 0).flatten().tolist())
        assert mb.input_ids.shape[1] == 29 and len(starts) == 4 and not {8, 16, 24} & starts
    model = _load(folder)
    sink = EntropySink(grad=True)
    lp = forward_logprobs(model, mb, 0.7, entropy=sink)
    loss = _loss(lp, mb, sink.value)
    loss.backward()
    if not checkpointing:  # outside a context-parallel forward the ring-loaded model is plain SDPA (probe, empty rows)
        from actors.model.context_parallel import RING_ATTENTION

        with torch.no_grad():
            assert torch.allclose(forward_logprobs(_load(folder, RING_ATTENTION), mb, 0.7), lp, atol=1e-6)
    for rank in range(C):
        got = torch.load(out / f"cp_{int(packed)}{int(checkpointing)}_{rank}.pt")
        assert torch.allclose(got["lp"], lp.detach(), atol=1e-5), (got["lp"] - lp).abs().max()
        assert torch.allclose(got["loss"], loss.detach(), atol=1e-6), (float(got["loss"]), float(loss))
        for name, p in model.named_parameters():
            assert torch.allclose(got["grads"][name], p.grad, atol=1e-5, rtol=1e-4), \
                (name, float((got["grads"][name] - p.grad).abs().max()))
