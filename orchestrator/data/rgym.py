"""reasoning-gym's procedural tasks as a data source: `data.source=reasoning_gym:<task>` (docs/data-sources.md).

Each row is one entry of ``reasoning_gym.create_dataset(<task>, **data.reasoning_gym.config, size=..., seed=...)``:
its ``question`` is the prompt (plus data.prompt_suffix), and its answer field is a *reference* to the entry, a JSON
string ``{"reasoning_gym": task, "index": i, "config": {...generation kwargs...}, "answer": gold, "answer_format": f}``.
The reward function ``reasoning_gym`` (orchestrator/reward/rgym.py) rebuilds ``dataset[index]`` from it in the
reward worker and scores with the dataset's own ``score_answer(answer, entry)``, as reasoning-gym's own training code
does (the entry's metadata, tuples included, is never round-tripped through JSON).

Bad input fails at config load, before any actor starts (orchestrator/data/checks.py): an unknown task (the
message lists the tasks), a generation parameter the task's config class does not take (the message lists the ones
it takes), a value its ``validate()`` refuses, ``seed``/``size`` inside ``config`` (they have their own keys), or the
``accuracy`` reward with a reasoning-gym source is refused by orchestrator/config/source_reward.py (its gold answers are references).
"""
from __future__ import annotations

import dataclasses
import json

from orchestrator.data.tasks import Example

PREFIX = "reasoning_gym:"
REWARD_NAME = "reasoning_gym"


def is_reasoning_gym(source: str) -> bool:
    """True when `source` (a data.source value) names a reasoning-gym task."""
    return str(source).startswith(PREFIX)


def generation_kwargs(data_cfg) -> dict:
    """The keyword arguments of ``reasoning_gym.create_dataset``: data.reasoning_gym.config plus size and seed
    (data.reasoning_gym.seed, or data.seed when it is null), as plain JSON values.

    Raises ValueError naming data.reasoning_gym.config when it sets seed or size, or holds a value that is not JSON.
    """
    rg = data_cfg.reasoning_gym
    config = rg.config if isinstance(rg.config, dict) else _to_container(rg.config)
    for key in ("seed", "size"):
        if key in config:
            raise ValueError(f"data.reasoning_gym.config.{key}: set data.reasoning_gym.{key} instead")
    kwargs = {**config, "size": int(rg.size), "seed": int(data_cfg.seed if rg.seed is None else rg.seed)}
    try:
        return json.loads(json.dumps(kwargs))  # what the reward worker will rebuild the dataset from, exactly
    except (TypeError, ValueError) as e:
        raise ValueError(f"data.reasoning_gym.config={config!r}: values must be JSON-like ({e})") from None


def _to_container(node) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def make_dataset(task: str, kwargs: dict):
    """``reasoning_gym.create_dataset(task, **kwargs)``; raises ValueError naming data.source or
    data.reasoning_gym.config for an unknown task or a parameter the task refuses."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ValueError(f"data.source={PREFIX + task!r}: reasoning-gym has no task {task!r}; its tasks are "
                         f"{', '.join(sorted(DATASETS))}")
    config_cls = DATASETS[task][1]
    known = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"data.reasoning_gym.config: task {task!r} has no parameter {', '.join(unknown)}; "
                         f"its parameters are {', '.join(k for k in known if k not in ('seed', 'size'))}")
    try:
        return reasoning_gym.create_dataset(task, **kwargs)
    except Exception as e:  # noqa: BLE001 - AssertionError, ValueError, TypeError, AttributeError (composite) ...
        shown = {k: v for k, v in kwargs.items() if k not in ("seed", "size")}
        raise ValueError(f"data.reasoning_gym.config={shown}: task {task!r} refuses it: "
                         f"{e or type(e).__name__}") from None


def reasoning_gym_examples(data_cfg) -> list[Example]:
    """The rows of data.source=reasoning_gym:<task>: `data.reasoning_gym.size` examples, deterministic in the seed.

    Raises ValueError naming the key for an unknown task or a refused generation parameter.
    """
    task = data_cfg.source[len(PREFIX):]
    kwargs = generation_kwargs(data_cfg)
    dataset = make_dataset(task, kwargs)
    fmt = data_cfg.reasoning_gym.answer_format
    suffix = data_cfg.prompt_suffix
    out = []
    for i in range(len(dataset)):
        entry = dataset[i]
        ref = {"reasoning_gym": task, "index": i, "config": kwargs, "answer": str(entry["answer"]),
               "answer_format": fmt}
        out.append(Example(prompt=entry["question"] + (f" {suffix}" if suffix else ""),
                           answer=json.dumps(ref, sort_keys=True)))
    return out
