"""The reward `reasoning_gym`: a reasoning-gym task's own scorer (docs/data-sources.md).

With ``data.source=reasoning_gym:<task>`` each gold answer is a JSON reference to a reasoning-gym entry
(orchestrator/data/rgym.py). `reasoning_gym_reward` rebuilds ``dataset[index]`` from it (the dataset object is cached
per worker process), takes the answer out of the completion by the row's ``answer_format`` and returns
``dataset.score_answer(answer, entry)``: a float in [0, 1] (1.0 = correct; some tasks give partial credit), the same
call reasoning-gym's own training code makes.

Try it::

    python -c "from orchestrator.reward.rgym import extract_answer_text as f; print(f('x <answer>8</answer>', 'answer_tag'))"
"""
from __future__ import annotations

import functools
import json
from typing import Optional

from orchestrator.reward.functions import extract_final_answer


def extract_answer_text(completion: str, answer_format: str) -> Optional[str]:
    """The answer in `completion`, or None when it has none.

    answer_format: "answer_tag" = the content of the last ``<answer>...</answer>`` (``reasoning_gym.utils.extract_answer``);
    "last_line" = the last non-empty line, stripped; "final_answer" = the last ``\\boxed{}`` content, else the last
    number (`extract_final_answer`). Raises ValueError for another format.
    """
    if answer_format == "answer_tag":
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion, tag_name="answer")
    if answer_format == "last_line":
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if answer_format == "final_answer":
        return extract_final_answer(completion)
    raise ValueError(f"reasoning_gym: unknown answer_format {answer_format!r}")


@functools.lru_cache(maxsize=32)
def _dataset(task: str, config_json: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **json.loads(config_json))


def parse_reference(answer: str) -> dict:
    """The reference dict of a reasoning-gym row's answer field. Raises ValueError when `answer` is not one."""
    try:
        ref = json.loads(answer)
    except (TypeError, ValueError):
        ref = None
    if not isinstance(ref, dict) or not {"reasoning_gym", "index", "config"} <= set(ref):
        raise ValueError(f"reasoning_gym: the gold answer {str(answer)[:80]!r} is not a reasoning-gym row reference; "
                         "this reward scores rows of data.source=reasoning_gym:<task>")
    return ref


def reasoning_gym_reward(completions: list[str], answers: list[str]) -> list[float]:
    """The task's own score of each completion, in [0, 1].

    Args:
        completions: the completions of one group, length G.
        answers: their gold answers, length G: references made by orchestrator/data/rgym.py.
    Returns:
        list[float] of length G.
    Raises:
        ValueError: for a length mismatch, an answer that is not a reference, or a rebuilt entry whose answer differs
            from the one the row was made with (another reasoning-gym version in the reward worker).
    """
    if len(completions) != len(answers):
        raise ValueError(f"reasoning_gym: got {len(completions)} completions and {len(answers)} answers")
    scores = []
    for completion, answer in zip(completions, answers):
        ref = parse_reference(answer)
        dataset = _dataset(ref["reasoning_gym"], json.dumps(ref["config"], sort_keys=True))
        entry = dataset[int(ref["index"])]
        if "answer" in ref and str(entry["answer"]) != ref["answer"]:
            raise ValueError(f"reasoning_gym: entry {ref['index']} of {ref['reasoning_gym']!r} rebuilt with answer "
                             f"{entry['answer']!r}, the row has {ref['answer']!r}: is the same reasoning-gym version "
                             "installed where the reward runs?")
        found = extract_answer_text(completion, ref.get("answer_format", "answer_tag"))
        scores.append(float(dataset.score_answer(found, entry)))
    return scores
