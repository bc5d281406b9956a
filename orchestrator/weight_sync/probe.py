"""The logprob probe after a weight sync: what the engine computes with, not only what it was sent (pure).

Checksums (checksum.py) prove the transfer: the values the engine's loader consumed equal the trainer's.
Where a backend repacks weights into its own kernels (vLLM's CPU GEMM packs every linear weight and leaves
an empty parameter behind; fused MoE layouts on GPUs), the resident kernel is not what was checksummed. So
after a verified sync the controller also scores one fixed token sequence on both sides and compares:

    prompt_ids, continuation_ids = probe_tokens(tokenizer.encode)     # once, ~40 ids of fixed text
    engine:  vLLM prompt logprobs of prompt_ids + continuation_ids  -> [len(continuation_ids)] float
    trainer: its forward over the same ids                          -> [len(continuation_ids)] float
    max_abs_diff = compare_probe(engine, trainer, tolerance, where="rollout worker 1")

Temperature: vLLM (0.32) computes prompt logprobs from the raw logits for every `logprobs_mode` ("prompt
tokens skip sampling processors", vllm/v1/worker/gpu_model_runner.py), so both sides score at
temperature 1, log_softmax(logits). The sampled tokens' temperature handling (case C03) is checked
where it matters, on the rollout's own logprobs; the probe checks the weights.

Tolerance (`weight_sync.probe_tolerance`, 0 = by the engine's dtype, `DEFAULT_TOLERANCE`): ten times the
largest difference measured after normal syncs (docs/weight-sync.md gives the measurement), per token times
max(1, |trainer logprob| / LOGPROB_SCALE): a correct engine's rounding error grows with the logits' magnitude (a
diverged policy scored a probe token at -176.5 nats, engine and trainer 0.0176 apart with identical weights: 1e-4
per nat; the tolerance allows 2.5e-4 per nat there, while a token near -11 nats keeps 2.8e-3).

Full-distribution check (`sync/probe_full_kl`): beside the sampled tokens, each engine returns its top
`weight_sync.probe_top_k` tokens' logprobs at every continuation position (vLLM prompt logprobs) and the trainer its
whole log-softmax rows; `probe_full_kl` is the KL(engine || trainer) of the two next-token distributions over those
top-k ids and one cell holding the rest of the vocabulary, the largest over positions. By the data-processing
inequality (Cover & Thomas, Elements of Information Theory, 2nd ed., Thm. 2.8.1) it is a lower bound of the KL of
the whole distributions, equal to it when the cells are single tokens; any fault that moves probability mass between
the engine's likely tokens and the rest shows in it, also where the sampled tokens' logprobs are untouched (a wrong
lm_head row, permuted logits). Its tolerance (`weight_sync.probe_kl_tolerance`, 0 = `DEFAULT_KL_TOLERANCE` by
dtype) is checked with the logprob tolerance, and a diverged policy is named first the same way.

Divergence first (issue 37): before an engine is blamed, the trainer's own probe logprobs are compared with the
ones of the weights the run started from (`probe_nll`, taken at the syncer's setup). A mean rise of more than
`guards.probe_nll_rise` nats per token means the policy diverged (an lr typo: trainer.lr=0.5 gave -176 nats per
token after one step): `divergence_note` names it, and a probe mismatch of a diverged policy is raised as
`PolicyDivergedError` naming the divergence, not the sync.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from orchestrator.guards import DivergedError
from orchestrator.weight_sync.checksum import WeightMismatchError

# Fixed text: the prompt and the continuation are scored together, the continuation's tokens compared.
PROBE_PROMPT = "Question: Tom has 12 apples and buys 30 more. How many apples does he have now?\nAnswer:"
PROBE_CONTINUATION = " He has 12 + 30 = 42 apples, so the answer is 42."

# Ten times the largest |engine - trainer| over the probe's tokens measured after normal syncs (default model,
# fp32 trainer, 2 CPU cores, docs/weight-sync.md): float32 engine 2.4e-5 (x10, rounded up to 1e-3 for other
# CPUs' kernels); bfloat16 engine 0.376 (x10 = 3.8, rounded up: a 16-bit engine against an fp32 trainer
# only catches gross faults). float16: not measured on CPU, the bfloat16 value (float16 is the finer).
DEFAULT_TOLERANCE = {"float32": 1e-3, "bfloat16": 4.0, "float16": 4.0}
LOGPROB_SCALE = 4.0  # nats: the tolerance grows in proportion to |trainer logprob| beyond this
# The full-distribution KL's tolerance in nats, by engine dtype (default model against the fp32 trainer,
# benchmarks/probe_full_kl.py, docs/weight-sync.md "The full-distribution check"): float32 measured 2.0e-9, allowed
# 1e-5 (the KL grows with the square of a logit error: other CPUs' and GPUs' fp32 kernels, up to the logprob
# tolerance's 40x margin, give up to 1600x); bfloat16 measured 8.3e-3, allowed 0.1 (x10, rounded up; float16 the same).
DEFAULT_KL_TOLERANCE = {"float32": 1e-5, "bfloat16": 0.1, "float16": 0.1}


@dataclass
class ProbeScores:
    """One side's scores of the probe text. `logprobs`: [n] float, nats, of the n continuation tokens.
    `top` (engine, when weight_sync.probe_top_k > 0): per continuation position {token id: logprob} of the engine's
    top-k tokens (and the continuation token). `rows` (trainer, when asked): [n, V] float32 log_softmax of the
    logits at those positions (temperature 1)."""

    logprobs: list[float]
    top: Optional[list[dict[int, float]]] = None
    rows: Optional[object] = None  # torch.Tensor; typed loosely to keep this module free of torch


class ProbeMismatchError(WeightMismatchError):
    """An engine's logprobs of the probe sequence differ from the trainer's by more than the tolerance:
    its resident weights are not the trainer's although the transfer verified (retried like a checksum
    mismatch by `WeightSyncer.sync_with_retries`)."""


class PolicyDivergedError(DivergedError):
    """The policy diverged (its own probe logprobs fell far below the starting weights'): a probe mismatch then is
    the diverged arithmetic, not the weight sync. The message names the signal, the version and what to do."""


def probe_nll(logprobs: Sequence[float]) -> float:
    """Mean negative logprob in nats per token of the probe's continuation (inf for a non-finite or empty one)."""
    values = [float(x) for x in logprobs]
    if not values or not all(math.isfinite(x) for x in values):
        return math.inf
    return -sum(values) / len(values)


def divergence_note(trainer: Sequence[float], start_nll: float, rise: float, version: int) -> str | None:
    """One line naming the divergence when the trainer's probe mean NLL (`probe_nll(trainer)`) exceeds the
    starting weights' `start_nll` by more than `rise` nats per token (guards.probe_nll_rise; 0 = off), or is not
    finite; else None."""
    if rise <= 0 or not math.isfinite(start_nll):
        return None
    nll = probe_nll(trainer)
    if nll - start_nll <= rise:
        return None
    return (f"the policy diverged by weight version {version}: the trainer's own logprobs of the fixed probe text "
            f"average {-nll:.4g} nats per token (the starting weights: {-start_nll:.4g}; guards.probe_nll_rise="
            f"{rise:g}), the signature of an update far too large (trainer.lr, trainer.grad_clip, the advantages) "
            "or of non-finite training; resume from a checkpoint before it with a lower trainer.lr")


def probe_tokens(encode: Callable[[str], Sequence[int]], min_tokens: int = 8) -> tuple[list[int], list[int]]:
    """(prompt ids, continuation ids) of the fixed probe text. `encode`: text -> token ids without special
    tokens (e.g. `lambda s: tokenizer.encode(s, add_special_tokens=False)`). Raises ValueError when either
    part has fewer than `min_tokens` ids (a tokenizer that cannot represent the text)."""
    prompt, cont = [int(i) for i in encode(PROBE_PROMPT)], [int(i) for i in encode(PROBE_CONTINUATION)]
    if len(prompt) < min_tokens or len(cont) < min_tokens:
        raise ValueError(f"weight-sync probe: the tokenizer gives {len(prompt)} prompt and {len(cont)} continuation "
                         f"ids for the probe text, expected at least {min_tokens} each")
    return prompt, cont


def tolerance_for(configured: float, dtype: str) -> float:
    """The probe tolerance in nats: `configured` (weight_sync.probe_tolerance) when > 0, else the default
    for the engine's `dtype` (rollout.dtype). Raises ValueError for a dtype without a default."""
    return _by_dtype(configured, dtype, DEFAULT_TOLERANCE, "weight_sync.probe_tolerance")


def _by_dtype(configured: float, dtype: str, defaults: dict[str, float], key: str) -> float:
    if configured > 0:
        return float(configured)
    if dtype not in defaults:
        raise ValueError(f"{key}=0 (by dtype): no default for rollout.dtype={dtype!r}; set {key} (defaults exist for "
                         f"{sorted(defaults)})")
    return defaults[dtype]


def probe_due(sync_index: int, every: int) -> bool:
    """Whether the `sync_index`-th sync of a syncer (0-based) runs the probe with weight_sync.probe_every =
    `every` (>= 1): the first sync always does (a restart or a resume is probed), then every `every`-th."""
    return sync_index % max(int(every), 1) == 0


def compare_probe(engine: Sequence[float], trainer: Sequence[float], tolerance: float, where: str) -> float:
    """Largest |engine[i] - trainer[i]| in nats (float). Raises ProbeMismatchError naming `where`, the
    largest difference, the token position and the tolerance when a difference exceeds `tolerance` x
    max(1, |trainer[i]| / LOGPROB_SCALE) (module docstring) or a value is not finite (NaN is reported as NaN); ValueError when the
    lengths differ."""
    if len(engine) != len(trainer):
        raise ValueError(f"{where}: the probe has {len(engine)} engine logprobs for {len(trainer)} trainer logprobs")
    diffs = [abs(float(a) - float(b)) for a, b in zip(engine, trainer)]
    bad = [i for i, (a, b) in enumerate(zip(engine, trainer)) if not (math.isfinite(a) and math.isfinite(b))]
    if bad:
        i = bad[0]
        raise ProbeMismatchError(f"{where}: probe logprob at token {i} is not finite (engine {engine[i]}, trainer "
                                 f"{trainer[i]}): the engine's resident weights are not usable")
    allowed = [tolerance * max(1.0, abs(float(b)) / LOGPROB_SCALE) for b in trainer]
    worst = max(range(len(diffs)), key=lambda i: diffs[i] / allowed[i]) if diffs else 0
    largest = max(diffs, default=0.0)
    if diffs and diffs[worst] > allowed[worst]:
        raise ProbeMismatchError(
            f"{where}: probe logprobs differ from the trainer's by up to {largest:.3g} nats (token {worst}: engine "
            f"{engine[worst]:.6g}, trainer {trainer[worst]:.6g}), above weight_sync.probe_tolerance={tolerance:g}"
            + (f" (x {allowed[worst] / tolerance:.3g} at that logprob)" if allowed[worst] > tolerance else "")
            + ": the engine computes with weights other than the ones it verified on loading")
    return largest


def probe_full_kl(top: Sequence[dict[int, float]], rows) -> float:
    """Largest KL(engine || trainer) in nats over the probe's positions, of the next-token distributions coarse-
    grained to the engine's listed ids and one cell for the rest of the vocabulary (module docstring: a lower bound
    of the full KL). `top`: per position {token id: engine logprob}; `rows`: [n, V] trainer log-softmax rows (a
    torch.Tensor). Computed in float64. Returns inf when a value is not finite; raises ValueError when the
    position counts differ."""
    import torch

    if len(top) != rows.shape[0]:
        raise ValueError(f"probe_full_kl: {len(top)} engine positions for {rows.shape[0]} trainer rows")
    worst = 0.0
    for t, cells in enumerate(top):
        ids = torch.tensor(list(cells), dtype=torch.long)
        p = torch.tensor(list(cells.values()), dtype=torch.float64)
        q = rows[t].to(torch.float64)[ids]
        if not (torch.isfinite(p).all() and torch.isfinite(q).all()):
            return math.inf
        kl = float((p.exp() * (p - q)).sum())
        p_rest, q_rest = _rest_log_mass(p), _rest_log_mass(q)
        if p_rest > -math.inf:
            kl += math.exp(p_rest) * (p_rest - q_rest)
        worst = max(worst, kl)
    return worst


def _rest_log_mass(logprobs) -> float:
    """log(1 - sum(exp(logprobs))), the log mass outside the listed ids (-inf when they hold all of it)."""
    import torch

    listed = float(torch.logsumexp(logprobs, 0))
    return math.log(-math.expm1(listed)) if listed < 0 else -math.inf


def kl_tolerance_for(configured: float, dtype: str) -> float:
    """The full-distribution KL tolerance in nats: `configured` (weight_sync.probe_kl_tolerance) when > 0, else the
    default for the engine's `dtype`. Raises ValueError for a dtype without a default."""
    return _by_dtype(configured, dtype, DEFAULT_KL_TOLERANCE, "weight_sync.probe_kl_tolerance")


def check_probe(engine: ProbeScores, trainer: ProbeScores, tolerance: float, kl_tolerance: float,
                where: str) -> tuple[float, Optional[float]]:
    """(largest |logprob difference| in nats, full-distribution KL in nats or None without the engine's top-k or the
    trainer's rows) of one engine's probe. Raises ProbeMismatchError as `compare_probe` does, or naming `where`,
    the KL and `kl_tolerance` when the KL exceeds it."""
    largest = compare_probe(engine.logprobs, trainer.logprobs, tolerance, where)
    if engine.top is None or trainer.rows is None:
        return largest, None
    kl = probe_full_kl(engine.top, trainer.rows)
    if not kl <= kl_tolerance:
        raise ProbeMismatchError(
            f"{where}: the engine's next-token distributions on the probe text differ from the trainer's by a KL of "
            f"{kl:.3g} nats (over its top tokens and the rest of the vocabulary), above "
            f"weight_sync.probe_kl_tolerance={kl_tolerance:g}, while the sampled tokens' logprobs agree within "
            f"{largest:.3g} nats: the engine computes logits other than the trainer's (a wrong output row, permuted "
            "logits), although it verified its weights on loading")
    return largest, kl
