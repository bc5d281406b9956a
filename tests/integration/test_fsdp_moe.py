"""FSDP2 data-parallel training (D = 2, gloo, CPU) of a mixture-of-experts policy.

Each rank routes only its own tokens, so an expert can be busy on one rank and idle on the other (checked
below from the routers' own choices). FSDP2 reduce-scatters the gradients of every sharded parameter in
one collective per unit; these tests show that such an expert neither hangs the step nor skews the update:

- without the router aux loss, the two ranks' update equals a single trainer's on the same global batch,
  padded and packed (where one rank also runs empty micro-batches);
- with the aux loss (computed per rank over the rank's own real tokens, as in Megatron-LM; see
  actors/trainer/moe_loss.py) the ranks train, report `actor/router_aux_loss` and the expert-load metrics, and
  the router weights move differently from the run without it.

Run: .venv/bin/python -m pytest -q tests/integration/test_fsdp_moe.py
"""
from __future__ import annotations

import pytest
import ray
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from actors.model.forward import collate
from actors.trainer.trainer import Trainer
from orchestrator.algo import TrainBatch
from tests.integration.test_fsdp import _batch, _cfgs, _ranks
from tests.integration.test_fsdp_packing_lora import ADAM_ATOL, BUDGET, _assert_close_and_moved, _rows, _uneven_batch

pytestmark = pytest.mark.integration
EXPERTS, TOP_K = 8, 1


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=EXPERTS, num_experts_per_tok=TOP_K, initializer_range=0.3,
                         tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("tiny_qwen3_moe_fsdp")
    Qwen3MoeForCausalLM(cfg).save_pretrained(folder)
    return folder


def _experts_used(folder, batch: TrainBatch, rank: int, d: int = 2) -> list[set[int]]:
    """Per MoE layer, the experts the routers of the initial model pick for rank `rank`'s shard's tokens
    (the trainer's shard: sample i goes to rank i % d)."""
    model = Qwen3MoeForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    keep = [i for i in range(len(batch)) if i % d == rank]
    mb = collate([batch.prompt_ids[i] for i in keep], [batch.response_ids[i] for i in keep], pad_id=0)
    with torch.no_grad():
        out = model.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, output_router_logits=True)
    real = mb.attention_mask.reshape(-1).bool()
    return [set(logits[real].topk(TOP_K, dim=-1).indices.reshape(-1).tolist()) for logits in out.router_logits]


def _assert_some_expert_idle_on_one_rank(folder, batch: TrainBatch) -> None:
    used = [_experts_used(folder, batch, r) for r in (0, 1)]
    one_sided = [layer for layer, (a, b) in enumerate(zip(*used)) if a ^ b]
    assert one_sided, f"every expert is used on both ranks or neither ({used}): the case is not exercised"


@pytest.mark.parametrize("packing", [False, True])
def test_two_moe_ranks_give_the_single_trainers_update(ray_local, tiny_moe, packing):
    over = {"packing": True, "micro_batch_tokens": BUDGET} if packing else {}
    tc, algo = _cfgs(router_aux_loss_coef=0.0, **over)
    batch = _uneven_batch() if packing else _batch()
    if packing:
        assert (_rows(batch, 0), _rows(batch, 1)) == (2, 4)  # rank 0 also runs 2 empty micro-batches
    _assert_some_expert_idle_on_one_rank(tiny_moe, batch)
    single = Trainer(str(tiny_moe), tc, algo, temperature=1.0, max_new_tokens=8)
    initial = {k: t.clone() for k, t in single.weights_for_sync("float32")[0]}
    ranks = _ranks(tiny_moe, tc, algo)
    try:
        want = single.train_step(batch)
        got = ray.get(ranks[0].train_step.remote(batch))
        for key in ("actor/loss", "actor/grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
        ours, _ = single.weights_for_sync("float32")
        moved = _assert_close_and_moved(named, ours, initial, ADAM_ATOL)
        assert any(".mlp.experts." in n and not torch.equal(t, initial[n]) for n, t in ours)  # experts trained
        assert moved >= len(ours) - 1  # everything trained (at most one tensor, e.g. a norm, may not move)
    finally:
        for r in ranks:
            ray.kill(r)


def test_two_moe_ranks_with_the_router_aux_loss(ray_local, tiny_moe):
    batch = _batch()
    _assert_some_expert_idle_on_one_rank(tiny_moe, batch)
    routers = {}
    for coef in (0.0, 0.5):
        tc, algo = _cfgs(router_aux_loss_coef=coef, lr=1e-2)
        ranks = _ranks(tiny_moe, tc, algo)
        try:
            for seed in (0, 1):  # two steps: nothing hangs and the second step sees the updated routers
                m = ray.get(ranks[0].train_step.remote(_batch(seed=seed)))
                assert m["actor/router_aux_loss"] > 0.0
                assert 1.0 <= m["moe/expert_load_max"] <= EXPERTS and m["moe/expert_load_cv"] >= 0.0
                assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
            named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
            routers[coef] = {n: t for n, t in named if n.endswith("mlp.gate.weight")}
        finally:
            for r in ranks:
                ray.kill(r)
    assert len(routers[0.0]) == 2
    assert any(not torch.allclose(routers[0.0][n], routers[0.5][n]) for n in routers[0.0])  # the aux loss acts
