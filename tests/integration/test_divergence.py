"""Non-finite updates on Ray (local, CPU, tiny random model, vLLM on CPU): skipped, not applied, counted.

- A GRPO run whose step 2 has a NaN loss (a policy-loss plugin, `algo.plugins`, that returns NaN while a flag
  file exists; the test sets the flag around the NaN steps only) skips that update: the trainer's weights and AdamW
  state after step 2 equal those after step 1 bit for bit, step 3 trains again, the engine holds the trainer's
  weights after every step, and the row counts it (actor/skipped_updates, actor/nonfinite_loss,
  actor/skipped_updates_total). The same run's NaNs at steps 4 and 5, in a row, stop it with DivergedError
  (run.max_skipped_updates=2).
- Two FSDP2 ranks (trainer.num_workers=2) where only rank 1's shard has NaN advantages both skip: the ranks stay
  in step, weights and optimizer state unchanged; the next good batch trains on both.
"""
from __future__ import annotations

import json
import math
import random

import pytest
import ray
import torch
from omegaconf import OmegaConf

from actors.trainer.sharded import ShardedTrainerActor
from orchestrator.algo import TrainBatch
from orchestrator.config import load_config
from orchestrator.config.schema import AlgoConfig, TrainerConfig
from orchestrator.controller import GRPOController
from orchestrator.guards import DivergedError
from tests.integration.conftest import assert_engine_holds_trainer_weights, tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"
PLUGIN = '''"""Test plugin: ppo_clip, but a NaN loss while the flag file exists."""
from pathlib import Path

from orchestrator.algo.loss import ppo_clip, register_policy_loss

FLAG = Path({flag!r})


@register_policy_loss({name!r})
def nan_while_flagged(inputs, cfg):
    loss, metrics = ppo_clip(inputs, cfg)
    return (loss * float("nan") if FLAG.exists() else loss), metrics
'''


@pytest.fixture(autouse=True)
def _restore_policy_losses():
    """The plugins register their losses in this process's registry: take them out again, so that later
    tests see only the built-in choices."""
    from orchestrator.algo import POLICY_LOSSES

    before = set(POLICY_LOSSES.names())
    yield
    for name in set(POLICY_LOSSES.names()) - before:
        POLICY_LOSSES.unregister(name)


def _run_with_nan(tiny_model, tmp_path, name: str, nan_steps: set, steps: int, *extra):
    """A run of `steps` steps whose steps in `nan_steps` have a NaN loss; returns (controller,
    {step: (weights, optimizer state) after it}, [the steps after which the engine held the trainer's weights at
    that version])."""
    flag = tmp_path / "nan_flag"
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(PLUGIN.format(flag=str(flag), name=name))
    over = tiny_overrides(tiny_model, tmp_path, **{"trainer.total_steps": steps})
    cfg = load_config("configs/grpo_arith_cpu.yaml", over + [REWARD, f"algo.plugins=['{plugin}']",
                                                             f"algo.policy_loss={name}", *extra])
    controller = GRPOController(cfg)
    snaps, synced, step = {}, [], controller.step

    def flagged_step(s):
        flag.touch() if s in nan_steps else flag.unlink(missing_ok=True)
        out = step(s)
        trainer = controller.actors.trainer
        named, _ = ray.get(trainer.weights_for_sync.options(num_returns=2).remote("float32"))
        snaps[s] = ({k: v.clone() for k, v in named}, ray.get(trainer.optimizer_state.remote())["state"])
        assert_engine_holds_trainer_weights(controller, s)
        synced.append(s)
        return out

    controller.step = flagged_step
    return controller, snaps, synced


def _same(a, b) -> bool:
    (wa, sa), (wb, sb) = a, b
    weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    state = sa.keys() == sb.keys() and all(torch.equal(sa[n][k], sb[n][k]) for n in sa for k in sa[n])
    return weights and state


# One run serves both checks: step 2's NaN is skipped and step 3 trains again; the NaNs of steps 4 and 5 in a row
# then stop it at run.max_skipped_updates=2.
def test_a_nan_step_is_skipped_and_two_in_a_row_stop_the_run(ray_local, tiny_model, tmp_path):
    controller, snaps, synced = _run_with_nan(tiny_model, tmp_path, "nan_at_steps_2_4_5", {2, 4, 5}, 6,
                                              "run.max_skipped_updates=2")
    try:
        with pytest.raises(DivergedError) as e:
            controller.run()
    finally:
        controller.shutdown()
    assert synced == [1, 2, 3, 4]  # after each: the engine held the trainer's weights (at that version)
    rows = {r["step"]: r for r in map(json.loads, open(tmp_path / "metrics.jsonl"))}
    assert sorted(rows) == [1, 2, 3, 4]  # step 5 raised: no row
    assert [rows[s]["actor/skipped_updates"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 1.0]
    assert rows[2]["actor/nonfinite_loss"] == 1.0 and rows[2]["actor/loss"] is None  # NaN in the JSONL log
    assert [rows[s]["actor/skipped_updates_total"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 1.0, 2.0]
    assert [rows[s]["actor/skipped_in_a_row"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 1.0]
    assert _same(snaps[1], snaps[2])  # weights and AdamW state bit for bit the last good ones
    assert not _same(snaps[2], snaps[3])  # step 3 trained again
    assert all(s["step"] == 1 for s in snaps[2][1].values())  # the skipped step did not count in AdamW's step
    assert _same(snaps[3], snaps[4])
    msg = str(e.value)
    assert "run.max_skipped_updates=2: 2 optimizer updates in a row were skipped" in msg
    assert "step 4: non-finite loss; step 5: non-finite loss" in msg and "checkpoint.resume=latest" in msg


def _batch(n: int = 8, seed: int = 0, nan_rows=()) -> TrainBatch:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    responses = [[rng.randrange(3, 500) for _ in range(rng.randint(1, 7))] for _ in range(n)]
    adv = [math.nan if i in nan_rows else rng.choice([-1.0, 0.5, 1.0]) for i in range(n)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses], adv)


def test_two_fsdp_ranks_skip_together_when_one_shard_is_nan(ray_local, tiny_model):
    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-3, "warmup_steps": 0, "micro_batch_size": 3, "num_threads": 1, "precision": "fp32",
               "shared_prefix": False})
    group = f"test-{random.getrandbits(40):x}"
    ranks = [ShardedTrainerActor.options(num_cpus=0.5).remote(str(tiny_model), tc, OmegaConf.structured(AlgoConfig),
                                                              1.0, 8, 0, rank=r, world_size=2, group_name=group,
                                                              timeout_s=120.0) for r in range(2)]
    try:
        ray.get([r.ready.remote() for r in ranks])
        ray.get(ranks[0].set_peers.remote(ranks[1:]))
        ray.get(ranks[0].train_step.remote(_batch(seed=0)))

        def snapshot():
            named, _ = ray.get(ranks[0].weights_for_sync.options(num_returns=2).remote("float32"))
            return {k: v.clone() for k, v in named}, ray.get(ranks[0].optimizer_state.remote())["state"]

        before = snapshot()
        m = ray.get(ranks[0].train_step.remote(_batch(seed=1, nan_rows={1, 3})))  # rank 1 takes the odd samples
        assert m["actor/skipped_updates"] == 1.0 and m["actor/nonfinite_loss"] == 1.0
        assert _same(before, snapshot())
        assert ray.get(ranks[0].get_step.remote()) == 1 == ray.get(ranks[1].get_step.remote())
        m = ray.get(ranks[0].train_step.remote(_batch(seed=2)))
        assert m["actor/skipped_updates"] == 0.0 and not _same(before, snapshot())
        assert ray.get(ranks[0].get_step.remote()) == 2 == ray.get(ranks[1].get_step.remote())
    finally:
        for r in ranks:
            ray.kill(r)
