"""The rollout's vLLM `SamplingParams`, one function for every request the engines get (actors/rollout/interruptible.py
and the benchmarks' bare vLLM)."""
from __future__ import annotations

from typing import Optional

from orchestrator.algo.sampler_support import SamplerSettings


def sampling_params(rollout_cfg, n: int, seed: Optional[int] = None, override=None, **extra):
    """`n` samples per prompt from the rollout's sampling distribution (temperature, top_p, top_k, min_p: one
    `SamplerSettings`, the one the trainer replays), up to `rollout.max_new_tokens` (exactly that many
    with `rollout.ignore_eos`, for benchmarks), with the sampled token's logprob (logprobs=0); `seed`: vLLM's
    per-request seed (None: the engine's random state). `override` (a request's SamplingOverride, held-out eval):
    its temperature (0 = greedy) and max_new_tokens instead, never ignore_eos. `extra`: other SamplingParams
    keywords, winning over these (partial rollouts: the budget left, DELTA outputs)."""
    from vllm import SamplingParams

    if override is not None:
        kwargs = dict(temperature=override.temperature, max_tokens=override.max_new_tokens)
    else:
        kwargs = dict(temperature=rollout_cfg.temperature, max_tokens=rollout_cfg.max_new_tokens,
                      ignore_eos=bool(getattr(rollout_cfg, "ignore_eos", False)))
    distribution = SamplerSettings.from_rollout(rollout_cfg).vllm_kwargs()
    return SamplingParams(**{"n": n, **distribution, "logprobs": 0, "seed": seed, **kwargs, **extra})
