"""Ring attention over 2 gloo ranks (orchestrator/algo/ring_dist.py, torch.multiprocessing.spawn, tiny
shapes) equals the one-process ring_attention and causal SDPA, its gradients (the backward's reverse ring)
equal autograd's through the one-process version, with and without packed documents and with an uneven split."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from orchestrator.algo.ring_attention import doc_ids_from_cu_seqlens, ring_attention, zigzag_positions

C = 2


def _inputs(t: int):
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(1, 2, t, 4, generator=g) for _ in range(3))
    docs = doc_ids_from_cu_seqlens(torch.tensor([0, 3, t - 2, t]), t)[None]
    return q, k, v, docs


CASES = ((8, False), (11, True))  # (seq_len, packed): 11 splits unevenly (chunks of 3, 3, 3, 2)


def _weights(q):
    return torch.randn(q.shape, generator=torch.Generator().manual_seed(99))


def _rank(rank: int, init: str, out_dir: str) -> None:
    from orchestrator.algo.ring_dist import ring_attention_dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=C)
    try:
        for t, packed in CASES:
            q, k, v, docs = _inputs(t)
            pos = zigzag_positions(t, C)[rank]
            local = [x[..., pos, :].clone().requires_grad_() for x in (q, k, v)]
            out = ring_attention_dist(*local, t, docs if packed else None)
            (out * _weights(q)[..., pos, :]).sum().backward()
            torch.save([out.detach()] + [x.grad for x in local], f"{out_dir}/out{t}_{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    path = tmp_path_factory.mktemp("ring")
    mp.spawn(_rank, args=(f"file://{path}/rendezvous", str(path)), nprocs=C, join=True)
    return path


@pytest.mark.parametrize("t, packed", CASES)
def test_two_gloo_ranks_equal_one_process(outputs, t, packed):
    q, k, v, docs = (x.requires_grad_() if x.is_floating_point() else x for x in _inputs(t))
    single = ring_attention(q, k, v, C, doc_ids=docs if packed else None)
    grads = torch.autograd.grad((single * _weights(q)).sum(), (q, k, v))
    out, dist_grads = torch.empty_like(q), [torch.empty_like(q) for _ in range(3)]
    for rank, pos in enumerate(zigzag_positions(t, C)):
        saved = torch.load(outputs / f"out{t}_{rank}.pt")
        out[..., pos, :] = saved[0]
        for whole, part in zip(dist_grads, saved[1:]):
            whole[..., pos, :] = part
    assert torch.allclose(out, single, atol=1e-6)
    for mine, ref in zip(dist_grads, grads):  # dq, dk, dv: the backward's reverse ring equals autograd
        assert torch.allclose(mine, ref, atol=1e-5)
    out, single = out.detach(), single.detach()
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    if packed:
        mask = mask & (docs[0][:, None] == docs[0][None, :])
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, ref, atol=1e-5)
