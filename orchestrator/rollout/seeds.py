"""Sampling seeds per request: a pure function of (rollout.seed, step, group id, sample index[, turn]).

Every sampled response gets its own vLLM `SamplingParams(seed=...)`, so what an engine samples for a
request depends only on the request and the weights, not on the engine's history, on which engine
serves it, on the other requests in the batch, or on whether the run was resumed from a checkpoint
(3 steps + resume + 3 steps = 6 steps, bit for bit on CPU: tests/integration/test_exact_resume.py).

    g = group_seed(cfg.rollout.seed, step, group_id)   # PromptRequest.seed (GRPOController.sample_prompts)
    s = sample_seed(g, i)                              # sample i of the group (actors/rollout/vllm_engine.py)
    t = turn_seed(s, turn)                             # multi-turn: turn `turn` of that sample
    r = resume_seed(s, done)                           # a partial rollout continuing after `done` tokens
    e = eval_seed(cfg.eval.seed, prompt_index)         # held-out eval (orchestrator/eval/runner.py)

The mix is SplitMix64's finaliser applied along the chain (stable across Python versions and
processes, unlike `hash()`), truncated to 63 bits: a non-negative int that `torch.Generator.manual_seed`
and vLLM accept. Inputs may be any Python ints (negative ones are taken modulo 2**64).
"""
from __future__ import annotations

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_TAGS = {"group": 0x67726F7570, "sample": 0x73616D706C65, "turn": 0x7475726E,  # b"group", b"sample", b"turn"
         "eval": 0x6576616C, "resume": 0x726573756D65}  # b"eval", b"resume"


def splitmix64(x: int) -> int:
    """SplitMix64 (Steele, Lea, Flood 2014) of `x` mod 2**64: a bijection on 64-bit ints with full avalanche."""
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _chain(tag: str, *values: int) -> int:
    h = splitmix64(_TAGS[tag])
    for v in values:
        h = splitmix64(h ^ (int(v) & _MASK64))
    return h & _MASK63


def group_seed(seed: int, step: int, group_id: int) -> int:
    """The seed of one group (`rollout.seed`, training step, group id unique over the run): an int in [0, 2**63)."""
    return _chain("group", seed, step, group_id)


def eval_seed(seed: int, prompt_index: int) -> int:
    """The group seed of eval prompt `prompt_index` (`eval.seed`): the same at every evaluation, so two evaluations
    differ only by their weights; tagged apart from `group_seed`, so it never equals a training group's seed chain."""
    return _chain("eval", seed, prompt_index)


def sample_seed(group: int, sample_index: int) -> int:
    """The vLLM sampling seed of sample `sample_index` (0 .. n-1) of a group with seed `group`: [0, 2**63)."""
    return _chain("sample", group, sample_index)


def turn_seed(sample: int, turn: int) -> int:
    """Multi-turn: the vLLM seed of turn `turn` (0-based) of a sample with seed `sample`: [0, 2**63)."""
    return _chain("turn", sample, turn)


def request_seed(seed: int, step: int, group_id: int, sample_index: int) -> int:
    """`sample_seed(group_seed(seed, step, group_id), sample_index)`: the seed of one single-turn response."""
    return sample_seed(group_seed(seed, step, group_id), sample_index)


def resume_seed(sample: int, tokens_done: int) -> int:
    """A partial rollout (orchestrator/rollout/partial.py) continuing after `tokens_done` >= 1 sampled tokens: the vLLM
    seed of its continuation (a fresh per-request generator, so it must differ from the first segment's)."""
    return _chain("resume", sample, tokens_done)
