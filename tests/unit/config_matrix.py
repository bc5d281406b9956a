"""The configuration matrix (issue 37): every config key with a choice, in pairwise (all-pairs) combinations.

Factors are generated, not hand-listed: the choice keys take their allowed values from the schema and the registries
(`CHOICES`: a newly registered estimator or loss, a new placement mode, joins the matrix by itself); the switches
that are not choice keys (truncated sampling, multi-turn, dynamic sampling, LoRA, packing, the
shared-prompt forward, context parallelism, elastic rollout) are listed with their overrides. `pairwise_cases()` covers every pair
of levels of every two factors at least once (allpairspy: a greedy all-pairs generator).
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

from allpairspy import AllPairs

from orchestrator.config.schema import CHOICES

CHOICE_KEYS = ("algo.estimator", "algo.policy_loss", "algo.loss_agg", "algo.rollout_correction.mode",
               "algo.old_logprobs", "placement.mode", "rollout.mode")
SWITCHES = {
    "sampling": {"full": [], "top_p": ["rollout.top_p=0.9"], "top_k": ["rollout.top_k=20"]},
    "multi_turn": {"off": [], "on": ["env.name=guessing", "env.kwargs={low: 1, high: 10, max_turns: 2}",
                                     "env.max_turns=2", "env.num_workers=1", "env.max_tokens=256"]},
    "dynamic_sampling": {"off": [], "on": ["algo.dynamic_sampling.enabled=true"]},
    "lora": {"off": [], "on": ["trainer.lora.rank=4"]},
    "packing": {"off": [], "on": ["trainer.packing=true", "trainer.micro_batch_tokens=512"]},
    "shared_prefix": {"on": [], "off": ["trainer.shared_prefix=false"]},
    "context_parallel": {"off": [], "on": ["trainer.context_parallel_size=2", "trainer.num_workers=2"]},
    "elastic": {"off": [], "on": ["placement.elastic=true", "rollout.max_workers=2"]},
}
# what a switch sets, for the refusal check: an error must name a key of each side
SWITCH_KEYS = {"sampling": ("rollout.top_p", "rollout.top_k"),
               "multi_turn": ("env.name", "env."), "dynamic_sampling": ("algo.dynamic_sampling",),
               "lora": ("trainer.lora",), "packing": ("trainer.packing", "trainer.micro_batch_tokens"),
               "shared_prefix": ("trainer.shared_prefix",),
               "context_parallel": ("trainer.context_parallel_size", "trainer.num_workers"),
               "elastic": ("placement.elastic", "rollout.max_workers")}


def factors() -> dict[str, dict[str, list[str]]]:
    """{factor: {level: its overrides}}: the choice keys' allowed values, then the switches."""
    out = {key: {str(v): [f"{key}={v}"] for v in CHOICES[key]} for key in CHOICE_KEYS}
    out.update(SWITCHES)
    return out


def pairwise_cases(load: Callable[[list[str]], Optional[str]]) -> tuple[list[dict[str, str]], dict]:
    """(cases, refused): every pair of levels of every two factors that `load` accepts is in at least one case, and
    every case loads; `refused` {(factor, level, factor, level): the error} holds the pairs `load` refuses.

    `load(overrides)` returns None when the config loads, else the error's message. A case that does not load is
    narrowed to the pair its error names (a key of each of two factors: `keys_of`), which joins `refused`, and the
    cases are generated again without it (allpairspy's filter), until every case loads. Raises AssertionError
    when an error names fewer than two of a case's factors (a refusal must name both keys)."""
    table, refused, seen = factors(), {}, {}
    names = list(table)
    while True:
        def allowed(row, found=tuple(refused)):
            pairs = {(a, la, b, lb) for (a, la), (b, lb) in itertools.combinations(zip(names, row), 2)}
            return not pairs & set(found)
        cases = [dict(zip(names, levels)) for levels in AllPairs([list(table[n]) for n in names], filter_func=allowed)]
        bad = False
        for case in cases:
            key = tuple(case.items())
            if key not in seen:
                seen[key] = load(overrides(case))
            error = seen[key]
            if error is not None:
                named = [f for f in names if any(k in error for k in keys_of(f))]
                assert len(named) >= 2, f"{case}: the refusal names fewer than two of its keys: {error}"
                a, b = named[:2]
                refused[(a, case[a], b, case[b])] = error
                bad = True
        if not bad:
            return _complete(cases, refused, load, seen)


def _complete(cases: list, refused: dict, load, seen: dict) -> tuple[list, dict]:
    """Cover the pairs the greedy generator left out: each one substituted into the existing cases in turn, the
    first that loads joins the cases; a pair no case can take (a third key forbids it) joins `refused` with the last
    error."""
    table = factors()
    names = list(table)
    covered = {(a, c[a], b, c[b]) for c in cases for a, b in itertools.combinations(names, 2)}
    for a, b in itertools.combinations(names, 2):
        for la, lb in itertools.product(table[a], table[b]):
            if (a, la, b, lb) in covered or (a, la, b, lb) in refused:
                continue
            error = None
            for base in cases:
                case = {**base, a: la, b: lb}
                key = tuple(case.items())
                if key not in seen:
                    seen[key] = load(overrides(case))
                error = seen[key]
                if error is None:
                    cases.append(case)
                    covered |= {(x, case[x], y, case[y]) for x, y in itertools.combinations(names, 2)}
                    break
            if error is not None:
                refused[(a, la, b, lb)] = error
    return cases, refused


def overrides(case: dict[str, str]) -> list[str]:
    """The config overrides of one case."""
    table = factors()
    return [o for factor, level in case.items() for o in table[factor][level]]


def keys_of(factor: str) -> tuple[str, ...]:
    """The config keys (or key prefixes) a factor sets."""
    return (factor,) if factor in CHOICE_KEYS else SWITCH_KEYS[factor]
