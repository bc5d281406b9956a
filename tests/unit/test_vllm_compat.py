"""actors/rollout/vllm_compat.py: every vLLM API the rollout engine uses (weight sync on vLLM's
weight-transfer protocol included) is in the installed vLLM; one that changed fails the engine's start naming the API and its user."""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Literal

import pytest

from actors.rollout import vllm_compat
from actors.rollout.vllm_compat import SUPPORTED, VLLMAPIError, check_vllm_api, vllm_api_problems


def test_the_installed_vllm_has_every_api_we_use():
    assert vllm_api_problems() == []  # a failure here names each API that changed: see vllm_compat.NEEDED
    check_vllm_api()
    assert vllm_compat.installed_version().startswith("0.32")  # SUPPORTED's range; pyproject.toml's gpu extra
    assert f'"vllm{SUPPORTED}"' in (Path(__file__).parents[2] / "pyproject.toml").read_text()  # the gpu extra


class _Kind(enum.Enum):
    CUMULATIVE = 0
    FINAL_ONLY = 2


def _changed_vllm(path: str):
    """The installed vLLM with three changes: a method renamed, a keyword dropped, an enum member gone."""
    if path == "vllm:LLM.reset_prefix_cache":
        raise AttributeError("type object 'LLM' has no attribute 'reset_prefix_cache'")
    if path == "vllm.v1.engine.llm_engine:LLMEngine.abort_request":
        return lambda self, ids: None  # request_ids renamed
    if path == "vllm.sampling_params:RequestOutputKind":
        return _Kind  # DELTA gone
    if path == "vllm.config.model:LogprobsMode":
        return Literal["raw_logprobs", "processed_logprobs"]
    return vllm_compat._resolve(path)


def test_a_changed_api_is_named_with_its_user_and_the_supported_range():
    with pytest.raises(VLLMAPIError) as info:
        check_vllm_api(resolve=_changed_vllm)
    message = str(info.value)
    assert f"supported: vllm{SUPPORTED}" in message
    assert "vllm:LLM.reset_prefix_cache is gone (AttributeError" in message and "after every weight load" in message
    assert "LLMEngine.abort_request no longer takes or holds ['request_ids']; used by actors/rollout/interruptible" \
        in message
    assert "RequestOutputKind no longer takes or holds ['DELTA']" in message
    assert message.count("\n  ") == 3  # one line per change, nothing else


def test_a_changed_weight_transfer_api_is_named_before_any_sync():
    """vLLM's weight-transfer protocol is what weight sync runs on: a renamed worker call or a changed engine
    constructor fails the engine's start naming it and our engine (actors/weight_sync/transfer_engine.py)."""
    def changed(path):
        if path == "vllm.v1.worker.gpu_worker:Worker.finish_weight_update":
            raise AttributeError("type object 'Worker' has no attribute 'finish_weight_update'")
        if path == "vllm.distributed.weight_transfer.base:WeightTransferEngine.__init__":
            return lambda self, config, vllm_config, model: None  # `device` dropped
        return vllm_compat._resolve(path)

    with pytest.raises(VLLMAPIError) as info:
        check_vllm_api(resolve=changed)
    lines = str(info.value).split("\n  ")[1:]
    assert lines[0].startswith("vllm.distributed.weight_transfer.base:WeightTransferEngine.__init__ no longer takes or "
                               "holds ['device']; used by actors/weight_sync/transfer_engine.py")
    assert lines[1].startswith("vllm.v1.worker.gpu_worker:Worker.finish_weight_update is gone (AttributeError")
    assert "update_weights" in lines[1] and len(lines) == 2


def test_the_apis_we_do_not_use_are_reported_but_not_required():
    def without_pause(path):
        if path.endswith("AsyncLLM.pause_generation"):
            raise AttributeError("gone")
        return vllm_compat._resolve(path)

    assert [p.split(" ")[0] for p in vllm_api_problems(resolve=without_pause)] == [
        "vllm.v1.engine.async_llm:AsyncLLM.pause_generation"]
    assert vllm_api_problems(required_only=True, resolve=without_pause) == []
    check_vllm_api(resolve=without_pause)  # not used (a weight update aborts and continues instead)
