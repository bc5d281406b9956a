"""actors/rollout/vllm_engine.sampling_params: the rollout config's sampling settings as vLLM SamplingParams."""
from __future__ import annotations

import pytest

from orchestrator.config import load_config

from actors.rollout.vllm_engine import sampling_params


def test_sampling_params_follow_the_rollout_config():
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["rollout.temperature=0.7", "rollout.top_p=0.9"]).rollout
    sp = sampling_params(cfg, 4)
    assert (sp.n, sp.temperature, sp.top_p, sp.max_tokens, sp.logprobs) == (4, 0.7, 0.9, cfg.max_new_tokens, 0)
    assert sp.ignore_eos is False


def test_ignore_eos_runs_every_response_to_max_new_tokens():
    cfg = load_config("configs/grpo_arith_cpu.yaml", ["rollout.ignore_eos=true", "rollout.max_new_tokens=16"]).rollout
    sp = sampling_params(cfg, 2)
    assert sp.ignore_eos is True and sp.max_tokens == 16


def test_engine_cpu_count_reads_the_first_rank_of_the_vllm_bind_list():
    import os

    from actors.rollout.vllm_engine import _engine_cpu_count

    assert _engine_cpu_count("0-1") == 2
    assert _engine_cpu_count("0,2,5-6") == 4
    assert _engine_cpu_count("3") == 1
    assert _engine_cpu_count("0,1|2,3") == 2  # tensor-parallel ranks: the first rank's list
    cores = len(os.sched_getaffinity(0))
    assert _engine_cpu_count("auto") == _engine_cpu_count("nobind") == _engine_cpu_count("") == cores
    for bad in ("0,1,", "3-0", "a-b"):
        with pytest.raises(ValueError, match="VLLM_CPU_OMP_THREADS_BIND"):
            _engine_cpu_count(bad)
