"""actors/rollout/sampling.sampling_params: the rollout config's sampling settings as vLLM SamplingParams."""
from __future__ import annotations

import pytest

from orchestrator.config import load_config

from actors.rollout.sampling import sampling_params


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


class _LLMEngine:
    """vLLM's LLMEngine add_request / step: every request finishes in one step with one token (its seed mod 7)."""

    def __init__(self):
        self.added, self.pending = [], []  # (request id, prompt ids, SamplingParams): all; not stepped yet

    def add_request(self, rid, prompt, params):
        self.added.append((rid, list(prompt["prompt_token_ids"]), params))
        self.pending.append(self.added[-1])

    def step(self):
        from types import SimpleNamespace

        out, stepped, self.pending = [], self.pending, []
        for rid, _, params in stepped:
            token = (params.seed or 0) % 7
            completion = SimpleNamespace(token_ids=[token], logprobs=[{token: SimpleNamespace(logprob=-1.0)}],
                                         finish_reason="stop")
            out.append(SimpleNamespace(request_id=rid, outputs=[completion], finished=True, num_cached_tokens=0))
        return out

    def abort_request(self, ids):
        pass


def _generate(requests, n: int, version: int):
    """The worker's synchronous generation (actors/rollout/stream.py `generate`) over a fake engine: the
    trajectories and what the engine was asked for."""
    from types import SimpleNamespace

    from actors.rollout.interruptible import InterruptibleEngine
    from actors.rollout.stream import StreamingGenerator

    llm_engine = _LLMEngine()
    engine = SimpleNamespace(llm=SimpleNamespace(llm_engine=llm_engine), cfg=load_config("configs/grpo_arith_cpu.yaml", []).rollout,
                             tokenizer=SimpleNamespace(decode=lambda ids, **k: "t"))
    engine.interruptible = lambda: InterruptibleEngine(engine)
    stream = StreamingGenerator(engine, n, engine.cfg.max_new_tokens, lambda: version)
    try:
        trajs = [s.to_trajectory() for s in stream.generate(requests)]
    finally:
        stream.close()
    return trajs, llm_engine.added


def test_a_seeded_group_is_issued_as_one_seeded_request_per_sample():
    from orchestrator.rollout import PromptRequest
    from orchestrator.rollout.seeds import sample_seed

    reqs = [PromptRequest(group_id=g, prompt_ids=[1, g + 2], answer="", seed=100 + g) for g in (4, 5)]
    trajs, added = _generate(reqs, 3, version=2)
    params = [p for _, _, p in added]
    assert [p.n for p in params] == [1] * 6
    assert [p.seed for p in params] == [sample_seed(100 + g, i) for g in (4, 5) for i in range(3)]
    assert [ids for _, ids, _ in added] == [[1, 6]] * 3 + [[1, 7]] * 3
    assert [t.group_id for t in trajs] == [4, 4, 4, 5, 5, 5] and {t.weight_version for t in trajs} == {2}
    assert [t.response_ids for t in trajs] == [[p.seed % 7] for p in params] and {t.text for t in trajs} == {"t"}


def test_unseeded_requests_sample_on_the_engines_random_state():
    from orchestrator.rollout import PromptRequest

    trajs, added = _generate([PromptRequest(group_id=0, prompt_ids=[1], answer="")], 4, version=0)
    assert len(added) == 4 and {p.seed for _, _, p in added} == {None} and len(trajs) == 4


def test_cpu_engines_prefill_whole_prompts_for_seeded_requests():
    from actors.rollout.vllm_engine import cpu_seeded_scheduling

    assert cpu_seeded_scheduling(1024) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    assert cpu_seeded_scheduling(8192)["max_num_batched_tokens"] == 8192  # a whole prompt fits one step


def test_a_response_cut_inside_a_character_reads_as_vllms_text():
    """vLLM's detokenizer leaves out trailing ids that end inside a UTF-8 character; `decode` would give U+FFFD."""
    from types import SimpleNamespace

    from actors.rollout.interruptible import InterruptibleEngine

    pieces = {1: b"ab", 2: b" \xe2", 3: b"\x80"}  # id 2 starts a 3-byte character, id 3 continues it

    def decode(ids, skip_special_tokens=True):
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    gen = object.__new__(InterruptibleEngine)
    gen.tokenizer = SimpleNamespace(decode=decode)
    assert gen.text(SimpleNamespace(response_ids=[1, 2, 3])) == "ab"
    assert gen.text(SimpleNamespace(response_ids=[1, 2])) == "ab"
    assert gen.text(SimpleNamespace(response_ids=[1])) == "ab"
