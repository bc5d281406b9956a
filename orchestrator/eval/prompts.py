"""The eval prompt set and the training items it leaves, chosen before any actor starts. Pure: no Ray.

    split = eval_split(cfg, examples)   # examples: data.source's rows (orchestrator.data.load_examples)
    split.train_items                   # indices of `examples` the training loader may draw
    split.prompts                       # [Example]: the eval prompts, distinct texts, in eval order

Two sources (docs/eval.md):
- `eval.holdout`: a fraction (0 < h < 1) or a count (h >= 1) of data.source's distinct prompt texts, chosen with
  eval.seed, is held out: every training row with one of those texts is removed from the training items, so
  no eval prompt is ever trained on (this changes what training draws).
- `eval.data`: its own rows ("arith": the built-in task with eval.seed, data.arith_* ranges and
  data.prompt_suffix; "reasoning_gym:<task>": the task with data.reasoning_gym's parameters and eval.seed; or a
  .jsonl / .parquet file). Training is left exactly as it is; eval prompts whose text
  the training loader draws in trainer.total_steps steps (replayed on a copy, plus one prefetched batch) are
  dropped, so the eval set is still never trained on by this run.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from types import SimpleNamespace

from omegaconf import OmegaConf

from orchestrator.data import DatasetError, Example, StatefulLoader, load_examples


@dataclass
class EvalSplit:
    """train_items: indices of the training examples the loader may draw; prompts: the eval prompts;
    dropped: eval candidates dropped because the run trains on their text."""

    train_items: list[int]
    prompts: list[Example]
    dropped: int = 0


def distinct(examples: list[Example]) -> list[Example]:
    """The first example of each prompt text, in order."""
    seen: set[str] = set()
    out = []
    for ex in examples:
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            out.append(ex)
    return out


def holdout_count(holdout: float, distinct_prompts: int) -> int:
    """Prompts held out: round(h * distinct) for 0 < h < 1 (at least 1), int(h) for h >= 1, 0 for h = 0.
    Raises ValueError naming eval.holdout when a count is not whole or leaves no prompt to train on."""
    if holdout <= 0:
        return 0
    if holdout < 1:
        count = max(1, round(holdout * distinct_prompts))
    elif holdout != int(holdout):
        raise ValueError(f"eval.holdout={holdout}: a count (>= 1) must be a whole number; a fraction is in (0, 1)")
    else:
        count = int(holdout)
    if count >= distinct_prompts:
        raise ValueError(f"eval.holdout={holdout} holds out {count} of data.source's {distinct_prompts} distinct "
                         "prompts: none would be left to train on")
    return count


def trained_prompts(examples: list[Example], items: list[int], data_cfg, prompts_per_step: int, steps: int) -> set[str]:
    """The prompt texts a fresh training loader over `items` draws in `steps` + 1 batches (the +1: the batch
    rollout.mode one_step_off or stream prefetches). Replays a copy: the run's loader is not touched."""
    loader = StatefulLoader(items, prompts_per_step, seed=data_cfg.seed, shuffle=data_cfg.shuffle)
    return {examples[k].prompt for _ in range(steps + 1) for k in loader.next_batch()}


def eval_examples(cfg) -> list[Example]:
    """The rows of `eval.data`: "arith" = the built-in task with eval.seed (data.arith_* and data.prompt_suffix),
    "reasoning_gym:<task>" = the task with data.reasoning_gym and eval.seed,
    else a .jsonl / .parquet file (data.prompt_suffix appended). Raises DatasetError naming eval.data."""
    d = cfg.data
    fields = {"source": cfg.eval.data, "seed": cfg.eval.seed, "arith_ops": list(d.arith_ops), "arith_min": d.arith_min,
              "arith_max": d.arith_max, "arith_size": d.arith_size, "prompt_suffix": d.prompt_suffix,
              # reasoning_gym:<task>: data.reasoning_gym's parameters, drawn with eval.seed (docs/data-sources.md)
              "reasoning_gym": SimpleNamespace(**{**OmegaConf.to_container(d.reasoning_gym), "seed": None})}
    try:
        return load_examples(_Section(**fields))
    except (DatasetError, ValueError) as e:
        raise DatasetError(str(e).replace("data.source", "eval.data")) from None


@dataclass
class _Section:
    """The fields of a `data` section that `load_examples` reads."""

    source: str
    seed: int
    arith_ops: list
    arith_min: int
    arith_max: int
    arith_size: int
    prompt_suffix: str
    reasoning_gym: SimpleNamespace


def eval_split(cfg, examples: list[Example]) -> EvalSplit:
    """The training items and eval prompts of the config (see the module docstring). With eval off
    (eval.every_steps 0) or neither eval.data nor eval.holdout: every example trains, no eval prompt. Raises DatasetError naming eval.num_prompts when the
    eval set has fewer prompts than asked for, ValueError naming eval.holdout for a bad holdout."""
    e = cfg.eval
    every = list(range(len(examples)))
    if e.every_steps <= 0:
        return EvalSplit(every, [])
    if e.holdout > 0:
        texts = distinct(examples)
        random.Random(e.seed).shuffle(texts)
        held = texts[: holdout_count(e.holdout, len(texts))]
        out = {ex.prompt for ex in held}
        split = EvalSplit([i for i in every if examples[i].prompt not in out], held)
    elif e.data:
        trained = trained_prompts(examples, every, cfg.data, cfg.rollout.prompts_per_step, cfg.trainer.total_steps)
        candidates = distinct(eval_examples(cfg))
        kept = [ex for ex in candidates if ex.prompt not in trained]
        split = EvalSplit(every, kept, dropped=len(candidates) - len(kept))
    else:
        return EvalSplit(every, [])
    return _first(split, e.num_prompts)


def _first(split: EvalSplit, num_prompts: int) -> EvalSplit:
    if num_prompts > len(split.prompts):
        raise DatasetError(f"eval.num_prompts={num_prompts}: the eval set has only {len(split.prompts)} prompts "
                           f"({split.dropped} dropped: the run trains on them); lower eval.num_prompts or give "
                           "more eval data")
    return replace(split, prompts=split.prompts[:num_prompts] if num_prompts else split.prompts)

