"""Exact resume of a fully asynchronous streaming run (rollout.mode=stream) on Ray (local, CPU), tiny
model: the step-2 checkpoint holds the finished samples of the untrained groups (and the generations in flight)
with their tokens, per-token versions and behaviour logprobs; the resumed run trains them as they were, bit for
bit (in-flight ones continue after the tokens they had), and no group is trained twice.

    .venv/bin/python -m pytest tests/integration/test_stream_exact_resume.py -q
"""
from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.rollout.stream_state import unpacked
from tests.integration.conftest import tiny_overrides

pytestmark = pytest.mark.integration
REWARD = "reward.functions=[{name: 'tests.integration.helpers:length_reward', weight: 1.0}]"


class Recording(GRPOController):
    """Keeps every trained trajectory, by step."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.trained: dict[int, list] = {}

    def train(self, trajs, advantages, ref):
        self.trained[len(self.trained) + self.start_step + 1] = list(trajs)
        return super().train(trajs, advantages, ref)


def _run(tiny_model, out, *extra) -> Recording:
    cfg = load_config("configs/grpo_arith_cpu.yaml", tiny_overrides(tiny_model, out, **{"rollout.max_new_tokens": 32}) + [
        REWARD, "rollout.mode=stream", "algo.max_staleness=2",
        "rollout.ignore_eos=true", "checkpoint.every_steps=2", *extra])
    controller = Recording(cfg)
    try:
        controller.run()
    finally:
        controller.shutdown()
    return controller


def test_a_resumed_streaming_run_trains_the_checkpointed_samples_bit_exact(ray_local, tiny_model, tmp_path):
    first = _run(tiny_model, tmp_path, "trainer.total_steps=2")
    state = json.loads((tmp_path / "ckpt" / "step_000002" / "state.json").read_text())["async"]
    finished, in_flight = unpacked(state, "finished"), unpacked(state, "in_flight")
    assert finished and state["ready"]  # complete groups waited in the buffer at the checkpoint
    resumed = _run(tiny_model, tmp_path, "trainer.total_steps=3", f"checkpoint.resume={tmp_path / 'ckpt' / 'step_000002'}")

    held = {(s["group_id"], tuple(s["response_ids"])): s for s in finished}
    step3 = resumed.trained[3]
    groups = {t.group_id for t in step3}
    assert len(step3) == 2 * 4 and len(groups) == 2  # prompts_per_step groups of rollout.n
    assert set(state["ready"][:2]) <= groups  # the buffer's first complete groups: the first batch after the resume
    from_checkpoint = [t for t in step3 if (t.group_id, tuple(t.response_ids)) in held]
    assert len(from_checkpoint) >= 4 * len(state["ready"][:2])
    for t in from_checkpoint:  # tokens, behaviour logprobs and versions as they were generated before the checkpoint
        s = held[(t.group_id, tuple(t.response_ids))]
        assert (t.logprobs, t.token_versions, t.finish_reason) == (s["logprobs"], _versions(s), s["finish_reason"])
    for s in (s for s in in_flight if s["group_id"] in groups):  # continued after the tokens it had
        n = len(s["response_ids"])
        assert any((t.response_ids[:n], t.logprobs[:n], t.token_versions[:n]) ==
                   (s["response_ids"], s["logprobs"], _versions(s)) for t in step3 if t.group_id == s["group_id"])
    before = {t.group_id for trajs in first.trained.values() for t in trajs}
    assert not before & groups  # no group trained twice across the resume


def _versions(state: dict) -> list[int]:
    return [v for v, count in state["versions"] for _ in range(count)]
