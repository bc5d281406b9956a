"""Completion samples: every `metrics.samples_every` steps, `metrics.samples_n` of the step's samples as records
that go to <run.output_dir>/samples.jsonl (orchestrator/metrics/samples_file.py) and to every sink's
`log_samples` (tracker tables). Pure: trajectories, rewards and a `decode(ids, skip_special_tokens)` in, dicts out.

    batch = ScoredBatch(trajs, rewards, advantages, reward_parts)    # the controller keeps the last step's
    log_completion_samples(sinks, cfg.metrics, step, batch, tokenizer)   # does nothing when not due

A record: {"step", "index" (in the batch), "group_id", "prompt", "completion", "answer", "reward" (the total),
"rewards" ({function name: raw value}; multi-turn: {"env": sum of the turn rewards}), "advantage" (the
sequence's mean advantage over its trained tokens), "response_len" (response tokens), "finish_reason"
("stop" | "length"), "weight_version", "turns" ([{"role", "content"}, ...]: multi-turn only, every turn of the
episode with its role, the prompt's included; [] for a single-turn sample)}. The samples are picked evenly
across the batch (indices i * B // n), never with a random draw: the run's RNG streams are untouched.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Optional

Decode = Callable[..., str]  # decode(ids: list[int], skip_special_tokens: bool) -> str
COLUMNS = ["step", "index", "group_id", "prompt", "completion", "answer", "reward", "rewards", "advantage",
           "response_len", "finish_reason", "weight_version", "turns"]
_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)


@dataclass
class ScoredBatch:
    """One step's trained batch: trajectories [B], total rewards [B], advantages per response token
    [B][len(response_i)], and each reward function's raw values {name: [B]} ({} for multi-turn)."""

    trajs: list
    rewards: list
    advantages: list
    reward_parts: dict


def samples_due(step: int, every: int) -> bool:
    """Whether step `step` logs samples (`metrics.samples_every`; 0 = never)."""
    return every > 0 and step % every == 0


def pick(batch_size: int, n: int) -> list[int]:
    """min(n, B) indices spread evenly over the batch: i * B // n (different groups when n <= groups)."""
    n = min(n, batch_size)
    return [i * batch_size // n for i in range(n)]


def chat_turns(text: str, default_role: str) -> list[dict]:
    """ChatML blocks of `text` (decoded with special tokens) as [{"role", "content"}]; an empty trailing block
    (the generation prompt) is dropped. Text without ChatML markers is one turn of `default_role`."""
    blocks = [{"role": r, "content": c.strip()} for r, c in _CHATML.findall(text)]
    if blocks and not blocks[-1]["content"]:
        blocks.pop()
    if not blocks and text.strip():
        blocks = [{"role": default_role, "content": text.strip()}]
    return blocks


def episode_turns(traj, decode: Decode) -> list[dict]:
    """Every turn of a multi-turn trajectory: the prompt's messages, then each run of sampled ids (loss mask 1,
    role "assistant") and of observation ids (mask 0, the role its chat template names, else "environment")."""
    turns = chat_turns(decode(traj.prompt_ids, skip_special_tokens=False), "user")
    mask, ids = traj.multiturn.loss_mask, traj.response_ids
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            if mask[start]:
                turns.append({"role": "assistant", "content": decode(ids[start:end], skip_special_tokens=True).strip()})
            else:
                turns += chat_turns(decode(ids[start:end], skip_special_tokens=False), "environment")
            start = end
    return turns


def sequence_advantage(adv: list, mask: Optional[list]) -> float:
    """Mean of a sample's token advantages over its trained tokens (mask 1; all when mask is None); 0.0 if none."""
    vals = [a for i, a in enumerate(adv) if mask is None or mask[i]]
    return float(sum(vals) / len(vals)) if vals else 0.0


def sample_record(step: int, i: int, batch: ScoredBatch, decode: Decode) -> dict:
    """The record of sample `i` of `batch` (see the module docstring)."""
    t = batch.trajs[i]
    multi = t.multiturn is not None
    parts = {"env": float(t.multiturn.reward)} if multi else {k: float(v[i]) for k, v in batch.reward_parts.items()}
    return {"step": step, "index": i, "group_id": t.group_id,
            "prompt": t.prompt or decode(t.prompt_ids, skip_special_tokens=True),
            "completion": t.text or decode(t.response_ids, skip_special_tokens=True), "answer": t.answer,
            "reward": float(batch.rewards[i]), "rewards": parts,
            "advantage": sequence_advantage(batch.advantages[i], t.multiturn.loss_mask if multi else None),
            "response_len": len(t.response_ids), "finish_reason": t.finish_reason,
            "weight_version": t.weight_version, "turns": episode_turns(t, decode) if multi else []}


def sample_records(step: int, batch: ScoredBatch, n: int, decode: Decode) -> list[dict]:
    """`n` records of `batch` (fewer when the batch is smaller), picked evenly (`pick`)."""
    return [sample_record(step, i, batch, decode) for i in pick(len(batch.trajs), n)]


def table_rows(samples: list[dict]) -> tuple[list[str], list[list]]:
    """(COLUMNS, one row per record): scalars only, `rewards` and `turns` as JSON text (tracker tables)."""
    rows = [[json.dumps(s.get(c)) if c in ("rewards", "turns") else s.get(c) for c in COLUMNS] for s in samples]
    return list(COLUMNS), rows


def markdown_table(samples: list[dict], max_chars: int = 500) -> str:
    """The records as a markdown table (TensorBoard text), long cells cut at `max_chars`, "|" and newlines escaped."""
    columns, rows = table_rows(samples)

    def cell(v) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        return text[:max_chars].replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def log_completion_samples(sinks, metrics_cfg, step: int, batch: Optional[ScoredBatch], tokenizer) -> None:
    """When `step` is due (`metrics.samples_every`): `metrics.samples_n` records of `batch` to every sink's
    `log_samples` (samples.jsonl included). Nothing otherwise, or without a batch."""
    if batch is not None and samples_due(step, metrics_cfg.samples_every):
        sinks.log_samples(step, sample_records(step, batch, metrics_cfg.samples_n, tokenizer.decode))
