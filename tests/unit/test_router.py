"""Sticky routing: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018)."""
import math

import pytest

import orchestrator.rollout.router as router_module
from orchestrator.rollout.router import StickyRouter


@pytest.mark.parametrize("workers,eps", [(4, 0.1), (8, 0.25), (3, 1.0)])
def test_max_load_stays_within_capacity_at_every_placement(workers, eps):
    router = StickyRouter(workers, eps)
    for g in range(600):
        router.assign(g)
        assert max(router.loads().values()) <= math.ceil((1 + eps) * (g + 1) / workers)
    assert sum(router.loads().values()) == 600
    assert router.capacity(600) == math.ceil((1 + eps) * 600 / workers)


def test_bound_holds_when_every_group_hashes_to_the_same_spot():
    router = StickyRouter(4, eps=0.5)
    # every group hashes to one ring position (worst case for plain consistent hashing: one worker
    # would take all 40); the bound spreads them
    original = router_module.stable_hash
    router_module.stable_hash = lambda text: 0 if text.startswith("group:") else original(text)
    try:
        for g in range(40):
            router.assign(g)
    finally:
        router_module.stable_hash = original
    loads = sorted(router.loads().values())
    # capacity(40) = ceil(1.5 * 40 / 4) = 15
    assert max(loads) <= 15 and sum(loads) == 40 and loads[-3] > 0


def test_sticky_and_deterministic():
    a, b = StickyRouter(4), StickyRouter(4)
    first = [a.assign(g) for g in range(50)]
    assert [b.assign(g) for g in range(50)] == first  # same placement in a fresh router (no random seed)
    assert [a.assign(g) for g in range(50)] == first  # every later turn/sample of a group: same worker
    assert all(a.worker_of(g) == w for g, w in enumerate(first))
    a.release(7)
    assert a.worker_of(7) is None and sum(a.loads().values()) == 49
    a.release(7)  # unknown ids are ignored


def test_adding_a_worker_moves_few_groups():
    groups = range(1000)
    for n in (4, 8):
        r_n, r_n1 = StickyRouter(n), StickyRouter(n + 1)
        placed_n = [r_n.assign(g) for g in groups]
        placed_n1 = [r_n1.assign(g) for g in groups]
        moved = sum(x != y for x, y in zip(placed_n, placed_n1)) / len(groups)
        modulo_moved = sum(g % n != g % (n + 1) for g in groups) / len(groups)
        # ideal consistent hashing moves 1/(n+1) (0.2 and 0.11); measured 0.19 and 0.13; modulo 0.8 and 0.89
        assert moved < 1.5 / (n + 1) and modulo_moved > 0.75


def test_live_add_keeps_placed_groups_and_remove_replaces_them():
    router = StickyRouter(["w0", "w1"])
    placed = {g: router.assign(g) for g in range(10)}
    router.add_worker("w2")
    assert {g: router.worker_of(g) for g in range(10)} == placed  # warm caches are not abandoned
    assert router.loads()["w2"] == 0
    moved = router.remove_worker("w0")
    assert set(moved) == {g for g, w in placed.items() if w == "w0"}
    assert all(router.worker_of(g) in ("w1", "w2") for g in range(10))
    with pytest.raises(ValueError, match="already routed"):
        router.add_worker("w1")
    with pytest.raises(ValueError, match="not routed"):
        router.remove_worker("w0")


def test_bad_arguments():
    with pytest.raises(ValueError, match="non-empty"):
        StickyRouter(0)
    with pytest.raises(ValueError, match="distinct"):
        StickyRouter(["a", "a"])
    with pytest.raises(ValueError, match="eps > 0"):
        StickyRouter(2, eps=0)
