"""Load-time checks of the run's prompt sources, `data.source` and `eval.data`, so that a bad one fails before any
actor starts with an error naming the key (the loaders raise the same errors later, at the first read):

- the built-in tasks ("arith", "code_arith"): data.arith_ops are known operators, data.arith_size >= 1,
  data.arith_min <= data.arith_max;
- "reasoning_gym:<task>": the task exists and takes data.reasoning_gym.config (the dataset object is built, no row is
  generated); for eval.data with the eval's seed, as orchestrator/eval/prompts.py draws it.

    check_data_sources(cfg)      # ValueError naming data.source / eval.data / data.arith_* / data.reasoning_gym.*

A file source is not read here (it may be large, or only on the workers' filesystem); its rows are checked as it loads.
"""
from __future__ import annotations

from types import SimpleNamespace

from orchestrator.data.rgym import PREFIX, generation_kwargs, is_reasoning_gym, make_dataset
from orchestrator.data.tasks import arithmetic_examples

BUILT_IN = ("arith", "code_arith")


def check_data_sources(cfg) -> None:
    """Raise ValueError naming the key when data.source or eval.data is a built-in or reasoning-gym source that
    cannot produce rows (see the module docstring); file sources and an unset eval.data pass."""
    d = cfg.data
    sources = [("data.source", d.source, d.reasoning_gym.seed)]
    if cfg.eval.data:
        sources.append(("eval.data", cfg.eval.data, None))  # the eval draws reasoning-gym rows with eval.seed
    for key, source, rg_seed in sources:
        if source in BUILT_IN:
            _check_arith(d, key, source)
        elif is_reasoning_gym(source):
            seed = cfg.eval.seed if key == "eval.data" else d.seed
            section = SimpleNamespace(reasoning_gym=SimpleNamespace(size=d.reasoning_gym.size, seed=rg_seed,
                                                                    config=d.reasoning_gym.config), seed=seed)
            try:
                make_dataset(source[len(PREFIX):], generation_kwargs(section))
            except ValueError as e:
                msg = str(e).replace("data.source", key)
                raise ValueError(msg if key in msg else f"{key}={source!r}: {msg}") from None


def _check_arith(d, key: str, source: str) -> None:
    if d.arith_size < 1 or d.arith_min > d.arith_max:
        raise ValueError(f"data.arith_size={d.arith_size}, data.arith_min={d.arith_min}, data.arith_max={d.arith_max} "
                         f"({key}={source!r}): need arith_size >= 1 and arith_min <= arith_max")
    if source == "arith":  # code_arith writes its own functions; arith draws its operators from data.arith_ops
        try:
            arithmetic_examples(1, list(d.arith_ops), d.arith_min, d.arith_max, 0)
        except ValueError as e:  # names data.arith_ops
            raise ValueError(f"{e} ({key}={source!r})") from None
