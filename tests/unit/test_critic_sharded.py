"""The FSDP2-sharded critic (actors/critic_sharded.py) over 2 gloo ranks (forked processes, no Ray) equals
the single-process critic (actors/critic.py) on the same batches: values, loss, metrics, grad norm, updated
weights; checkpoints cross both ways (a sharded one loads into a single critic, a single one into the ranks) and
the update after the load equals the single critic's (the AdamW state came across). 7 samples over 2 ranks in
micro-batches of 3: rank 0 runs 2 micro-batches, rank 1 one real and one empty."""
from __future__ import annotations

import datetime
import random
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from actors.critic import Critic, merge_values
from tests.unit.trainer_helpers import save_tiny_llama

D = 2


def _batch(seed: int, values=None) -> tuple:
    """(prompts, responses, returns, old values, response mask) of 7 samples; sample 2's first id is untrained."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 97) for _ in range(rng.randint(2, 6))] for _ in range(7)]
    responses = [[rng.randrange(3, 97) for _ in range(rng.randint(2, 7))] for _ in range(7)]
    returns = [[rng.uniform(-1, 1) for _ in r] for r in responses]
    old = values if values is not None else [[0.0] * len(r) for r in responses]
    mask = [[1] * len(r) for r in responses]
    mask[2][0] = 0
    return prompts, responses, returns, old, mask


def _cfgs():
    ccfg = SimpleNamespace(lr=1e-3, warmup_steps=1, weight_decay=0.01, grad_clip=0.05, micro_batch_size=3,
                           updates_per_step=2)
    return ccfg, SimpleNamespace(value_clip=0.2, loss_agg="token-mean")


def _metrics(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith("critic/")}


def _rank(rank: int, init: str, model: str, out: str) -> None:
    from actors.critic_sharded import ShardedCritic
    from actors.model.fsdp import full_state_dict

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=D,
                            timeout=datetime.timedelta(seconds=90))  # a mismatched collective fails, not hangs
    try:
        c = ShardedCritic(model, *_cfgs(), max_new_tokens=8, num_threads=1, rank=rank, world_size=D,
                          group_name="unit", timeout_s=120.0)
        b1 = _batch(1)
        m1 = c.update_local(*b1)
        v1 = c.local_values(*b1[:2])
        checksum = c.join_checksum()
        c.join_save(f"{out}/sharded_ckpt")
        m2 = c.update_local(*_batch(2))
        c.join_load(f"{out}/single_ckpt")  # the single critic after its first update
        m2_again = c.update_local(*_batch(2))
        full = full_state_dict(c.model)  # collective: the full weights on rank 0, {} on rank 1
        torch.save({"m1": m1, "v1": v1, "checksum": checksum, "m2": m2, "m2_again": m2_again, "full": full,
                    "step": c.get_step()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The single critic's results and the two ranks' (files rank0.pt, rank1.pt)."""
    # gloo ranks on the CPU, on a host with CUDA too. There autograd starts a thread per device at the first
    # backward, which forbids a fork after it: the ranks are spawned, with CUDA hidden from them
    start_method = "spawn" if torch.cuda.is_available() else "fork"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        yield _runs(tmp_path_factory, start_method)


def _runs(tmp_path_factory, start_method: str) -> SimpleNamespace:
    path = tmp_path_factory.mktemp("critic_sharded")
    model = str(save_tiny_llama(path / "model"))
    single = Critic(model, *_cfgs(), max_new_tokens=8, num_threads=1)
    b1 = _batch(1)
    ref = {"m1": single.update(*b1), "v1": single.values(*b1[:2]), "checksum": single.weights_checksum()}
    single.save(str(path / "single_ckpt"))
    ref["m2"] = single.update(*_batch(2))
    ref["full"] = {k: v.detach().clone() for k, v in single.model.state_dict().items()}
    # fork where it may: the ranks inherit this process's imports (a spawned one re-imports torch, transformers
    # and the trainer: ~8 s of CPU each); the parent never joined a process group and runs torch on one thread
    mp.start_processes(_rank, args=(f"file://{path}/rendezvous", model, str(path)), nprocs=D, join=True,
                       start_method=start_method)
    ranks = [torch.load(path / f"rank{r}.pt", weights_only=False) for r in range(D)]
    return SimpleNamespace(path=path, model=model, ref=ref, ranks=ranks)


def _same_metrics(a: dict, b: dict) -> None:
    a, b = _metrics(a), _metrics(b)
    assert a.keys() == b.keys() and "critic/grad_norm" in a
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k


def _same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=2e-6), (k, float((a[k] - b[k]).abs().max()))


def test_two_ranks_update_and_score_as_one_critic(runs):
    ref, (r0, r1) = runs.ref, runs.ranks
    _same_metrics(ref["m1"], r0["m1"])
    _same_metrics(ref["m1"], r1["m1"])  # every rank reports the global metrics
    assert ref["m1"]["critic/grad_norm"] > 0.05  # the clip (critic.grad_clip=0.05) acted
    values = merge_values(7, [r0["v1"], r1["v1"]])
    assert sorted(r0["v1"]) == [0, 2, 4, 6] and sorted(r1["v1"]) == [1, 3, 5]
    assert values == [pytest.approx(v, abs=1e-6) for v in ref["v1"]] and any(x != 0 for v in values for x in v)
    assert r0["checksum"] == pytest.approx(ref["checksum"], rel=1e-9)
    _same_metrics(ref["m2"], r0["m2"])  # a second update: the sharded AdamW state and schedule went on alike


def test_a_single_checkpoint_loads_into_the_ranks(runs):
    """The ranks load the single critic's checkpoint of its first update; their next update is its second one."""
    ref, r0 = runs.ref, runs.ranks[0]
    _same_metrics(ref["m2"], r0["m2_again"])
    _same_weights(ref["full"], r0["full"])
    assert r0["step"] == 4 and runs.ranks[1]["full"] == {}  # 2 + 2 optimizer steps; the full state on rank 0


def test_a_sharded_checkpoint_loads_into_a_single_critic(runs):
    assert (runs.path / "sharded_ckpt" / "sharded").is_dir()
    single = Critic(runs.model, *_cfgs(), max_new_tokens=8, num_threads=1)
    assert single.load(str(runs.path / "sharded_ckpt")) == 2
    assert single.weights_checksum() == pytest.approx(runs.ref["checksum"], rel=1e-9)
    _same_metrics(runs.ref["m2"], single.update(*_batch(2)))
    _same_weights(runs.ref["full"], {k: v.detach() for k, v in single.model.state_dict().items()})
