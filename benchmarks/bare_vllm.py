"""Bare vLLM, the baseline the rollout benchmarks measure our engine driver against: the same samples as
`RolloutWorker.generate` asks for (actors/rollout/stream.py `generate`: one vLLM request per sample of a seeded
group, `SamplingParams(n=1, seed=sample_seed(seed, i))`, orchestrator/rollout/seeds.py), handed to vLLM's own
`LLM.generate` in one call, and its outputs as trajectories.

    prompts, params, issued = generation_inputs(cfg.rollout, requests, cfg.rollout.n)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    trajectories = to_trajectories(issued, outputs, weight_version=0)
"""
from __future__ import annotations

from typing import Sequence

from actors.rollout.sampling import sampling_params
from orchestrator.rollout.seeds import sample_seed
from orchestrator.rollout.types import PromptRequest, Trajectory


def generation_inputs(rollout_cfg, requests: Sequence[PromptRequest], n: int) -> tuple[list, list, list]:
    """(vLLM prompts, SamplingParams, the request of each prompt): one vLLM request per sample, `n` per request (a
    request's `sampling` override: its own n, temperature, max_new_tokens), sample i of a seeded request with
    `seed=sample_seed(seed, i)`, of an unseeded one on the engine's random state: what the engine driver issues
    (orchestrator/rollout/partial.py `samples_of`, `PartialSample.seed`)."""
    def count(r: PromptRequest) -> int:
        return r.sampling.n if r.sampling is not None else n

    issued = [r for r in requests for _ in range(count(r))]
    params = [sampling_params(rollout_cfg, 1, None if r.seed is None else sample_seed(r.seed, i), r.sampling)
              for r in requests for i in range(count(r))]
    return token_prompts(issued), params, issued


def token_prompts(requests: Sequence[PromptRequest]) -> list:
    """vLLM token-id prompts of the requests (already rendered with the chat template)."""
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]


def to_trajectories(requests: Sequence[PromptRequest], outputs: Sequence, weight_version: int) -> list[Trajectory]:
    """One Trajectory per sample of vLLM's RequestOutputs (in request order), with per-token logprobs."""
    out = []
    for req, res in zip(requests, outputs):
        prompt_ids = list(req.prompt_ids)
        for c in res.outputs:
            ids = list(c.token_ids)
            lps = [d[t].logprob for t, d in zip(ids, c.logprobs)]
            out.append(Trajectory(group_id=req.group_id, prompt_ids=prompt_ids, response_ids=ids,
                                  logprobs=lps, finish_reason=c.finish_reason or "length", text=c.text,
                                  answer=req.answer, prompt=req.prompt, weight_version=weight_version))
    return out


def generate(llm, rollout_cfg, requests: Sequence[PromptRequest], n: int, weight_version: int = 0) -> list[Trajectory]:
    """`n` samples per request from `llm` (a `vllm.LLM`) in one `LLM.generate` call, as trajectories (request
    order, then sample index)."""
    prompts, params, issued = generation_inputs(rollout_cfg, requests, n)
    return to_trajectories(issued, llm.generate(prompts, params, use_tqdm=False), weight_version)
