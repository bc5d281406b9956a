"""orchestrator/rollout/pending.py: the async pipeline's generated, untrained batches as checkpoint text."""
from __future__ import annotations

import json

import pytest

from orchestrator.rollout import PromptRequest, Trajectory
from orchestrator.rollout.pending import pack, unpack, batch_to_dict
from orchestrator.rollout.source import Launched
from orchestrator.rollout.types import MultiTurnInfo


def _launched():
    reqs = [PromptRequest(group_id=6, prompt_ids=[1, 2], answer="3", prompt="1+2", seed=2**63 - 1)]
    single = Trajectory(group_id=6, prompt_ids=[1, 2], response_ids=[5, 7], logprobs=[-0.1 / 3, -1e-300],
                        finish_reason="stop", text="é 3", answer="3", prompt="1+2", weight_version=1)
    multi = Trajectory(group_id=6, prompt_ids=[1], response_ids=[4, 9, 4], logprobs=[-2.5, 0.0, float("-inf")],
                       finish_reason="length", weight_version=1, extra={"k": [1, "x"]},
                       multiturn=MultiTurnInfo([1, 0, 1], [0.5, 0.25], 2, "max_turns", sample_index=3, rollout_worker=1))
    return Launched(reqs, [1], [], results=[([single, multi], {"rollout/tokens": 4.0, "rollout/generate_s": 0.1})],
                    meta={"groups_per_worker_max": 1})


def test_a_batch_round_trips_exactly():
    launched = _launched()
    text = pack([batch_to_dict(3, 1, {"position": 4, "epoch": 0}, launched)])
    assert "\n" not in text and json.dumps(text)  # one line of state.json
    (b,) = unpack(text)
    assert (b["step"], b["weight_version"], b["loader_state"], b["workers"], b["meta"]) == \
        (3, 1, {"position": 4, "epoch": 0}, [1], {"groups_per_worker_max": 1})
    assert b["requests"] == launched.requests
    (trajs, metrics), = b["results"]
    assert trajs == launched.results[0][0] and metrics == launched.results[0][1]
    assert trajs[0].logprobs[0] == -0.1 / 3 and trajs[1].multiturn.reward == 0.75  # floats bit for bit


def test_corrupt_text_is_a_value_error_and_unserialisable_extra_a_type_error():
    with pytest.raises(ValueError, match="pending async batches"):
        unpack("not base64 !")
    launched = _launched()
    launched.results[0][0][0].extra["obj"] = object()
    with pytest.raises(TypeError):
        pack([batch_to_dict(3, 1, {}, launched)])
