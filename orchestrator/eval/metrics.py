"""Evaluation metrics over n samples per prompt. Pure Python: no Ray, no torch.

    correct = [[True, False, ...], ...]          # [P][n]: sample j of prompt p is correct
    pass_at_k(n=10, c=3, k=5)                    # 0.916667 (Chen et al. 2021, eq. 1)
    summarize(correct, finals, golds, ks=[1, 4]) # {"eval/pass_at_1": ..., "eval/maj_at_4": ..., ...}

Names use `_at_` for `@` (`eval/pass_at_1` is pass@1): MLflow and some tracker UIs refuse `@` in a metric name.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one prompt from n samples of which c are correct:
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1),
    computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), stable for large n (their numerically stable form).
    Raises ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(correct: Sequence[bool], k: int) -> float:
    """avg@k of one prompt: the mean correctness of its first k samples (the accuracy averaged over k samples,
    as in DeepSeek-R1's pass@1 "averaged over k responses", Guo et al. 2025, sec. 3.1). Raises ValueError for k
    outside [1, len(correct)]."""
    if not 1 <= k <= len(correct):
        raise ValueError(f"avg@k needs 1 <= k <= n={len(correct)}, got k={k}")
    return sum(bool(x) for x in correct[:k]) / k


def majority_answer(finals: Sequence[Optional[str]]) -> Optional[str]:
    """The most frequent final answer (exact string after strip; None = no answer, which does not vote); a tie
    goes to the answer seen first. None when no sample has an answer."""
    votes = [f.strip() for f in finals if f is not None and f.strip()]
    if not votes:
        return None
    counts = Counter(votes)
    best = max(counts.values())
    return next(v for v in votes if counts[v] == best)


def maj_at_k(finals: Sequence[Optional[str]], gold: str, k: int, match: Callable[[str, str], bool]) -> float:
    """maj@k of one prompt: 1.0 when the majority vote (`majority_answer`) of the first k samples' final answers
    matches `gold` by `match(predicted, gold)`, else 0.0 (self-consistency, Wang et al. 2023, "Self-Consistency
    Improves Chain of Thought Reasoning"; maj@k as in Lewkowycz et al. 2022, Minerva). Raises ValueError for k
    outside [1, len(finals)]."""
    if not 1 <= k <= len(finals):
        raise ValueError(f"maj@k needs 1 <= k <= n={len(finals)}, got k={k}")
    voted = majority_answer(finals[:k])
    return float(voted is not None and match(voted, gold))


def summarize(correct: Sequence[Sequence[bool]], finals: Optional[Sequence[Sequence[Optional[str]]]],
              golds: Optional[Sequence[str]], ks: Sequence[int],
              match: Optional[Callable[[str, str], bool]] = None) -> dict[str, float]:
    """Means over prompts of pass@1 (c / n: the greedy accuracy when n = 1), and of pass@k (`pass_at_k`), avg@k and
    maj@k for each k in `ks`: {"eval/pass_at_1", "eval/pass_at_<k>", "eval/avg_at_<k>", "eval/maj_at_<k>"}.
    correct, finals: [P][n] per prompt and sample (the same n for every prompt); golds: [P]; finals and golds None:
    no maj@k (a source without a single final answer, orchestrator/eval/majority.py); match: answer equality for
    maj@k (default orchestrator.reward.functions.answers_match). Raises ValueError for no prompt, ragged samples,
    or a k outside [1, n]."""
    if finals is None:
        finals, golds, majority = [[None] * len(c) for c in correct], [""] * len(correct), False
    else:
        majority = True
    if not correct or len(correct) != len(finals) or len(correct) != len(golds):
        raise ValueError(f"eval metrics need the same P >= 1 prompts in correct ({len(correct)}), "
                         f"finals ({len(finals)}) and golds ({len(golds)})")
    n = len(correct[0])
    if any(len(c) != n for c in correct) or any(len(f) != n for f in finals):
        raise ValueError("eval metrics need the same number of samples for every prompt")
    if match is None:
        from orchestrator.reward.functions import answers_match as match
    P = len(correct)
    out = {"eval/pass_at_1": sum(sum(map(bool, c)) / n for c in correct) / P}
    for k in ks:
        out[f"eval/pass_at_{k}"] = sum(pass_at_k(n, sum(map(bool, c)), k) for c in correct) / P
        out[f"eval/avg_at_{k}"] = sum(avg_at_k(c, k) for c in correct) / P
        if majority:
            out[f"eval/maj_at_{k}"] = sum(maj_at_k(f, g, k, match) for f, g in zip(finals, golds)) / P
    return out


def response_stats(lengths: Sequence[int], finish_reasons: Sequence[str]) -> dict[str, float]:
    """{"eval/response_len_mean": mean tokens per response, "eval/truncated_frac": the fraction whose
    finish_reason is "length" (cut at max_new_tokens)}. Raises ValueError for no response."""
    if not lengths or len(lengths) != len(finish_reasons):
        raise ValueError("response stats need one finish reason per response, and at least one response")
    return {"eval/response_len_mean": sum(lengths) / len(lengths),
            "eval/truncated_frac": sum(r == "length" for r in finish_reasons) / len(finish_reasons)}
