"""What maj@k votes on, by the eval source's kind of gold answer (orchestrator/data/datasets.py answer_kind):

- a plain answer (``arith``, a file source): the completion's final answer (the last ``\\boxed{}`` or number,
  orchestrator/reward/functions.py) against the gold answer;
- a reasoning-gym reference (``reasoning_gym:<task>``): the answer the task's reward reads (the row's
  ``answer_format``, orchestrator/reward/rgym.py) against the reference's gold ``answer``, not against the JSON
  reference itself (which no completion can equal);
- unit tests (``code_arith``): no single final answer to vote on, so maj@k is not reported.

    finals, golds = majority_inputs(kind, texts_by_prompt, golds_by_prompt)   # (None, None): no maj@k
"""
from __future__ import annotations

from typing import Optional, Sequence


def majority_inputs(kind: Optional[str], texts: Sequence[Sequence[str]], golds: Sequence[str]
                    ) -> tuple[Optional[list], Optional[list]]:
    """The final answers [P][n] and gold answers [P] maj@k compares for gold answers of `kind` ("answer", "tests",
    "reference" or None for a file source); (None, None) for "tests". Raises ValueError (orchestrator/reward/rgym.py
    parse_reference) for a reference that is not one."""
    if kind == "tests":
        return None, None
    if kind == "reference":
        from orchestrator.reward.rgym import extract_answer_text, parse_reference

        refs = [parse_reference(g) for g in golds]
        finals = [[extract_answer_text(t, ref.get("answer_format", "answer_tag")) for t in row]
                  for row, ref in zip(texts, refs)]
        return finals, [str(ref["answer"]) for ref in refs]
    from orchestrator.reward.functions import extract_final_answer

    return [[extract_final_answer(t) for t in row] for row in texts], list(golds)
