"""Completion samples (orchestrator/metrics/samples.py, samples_file.py) and the hyper-parameter redaction
(orchestrator/metrics/hparams.py): pure, no Ray.

    .venv/bin/python -m pytest tests/unit/test_samples.py -q
"""
from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.metrics.hparams import REDACTED, env_sourced_keys, flat_hparams, is_secret
from orchestrator.metrics.samples import (ScoredBatch, chat_turns, log_completion_samples, markdown_table, pick,
                                          sample_records, samples_due, table_rows)
from orchestrator.metrics.samples_file import SamplesFile
from orchestrator.rollout.types import MultiTurnInfo, Trajectory

VOCAB = {1: "<|im_start|>", 2: "<|im_end|>", 3: "user\n", 4: "tool\n", 5: "assistant\n", 6: "\n"}


def decode(ids, skip_special_tokens=False):
    """A toy tokenizer: id 1/2 are ChatML's special tokens, ids >= 10 are the letters a, b, c, ..."""
    out = []
    for i in ids:
        if i in (1, 2) and skip_special_tokens:
            continue
        out.append(VOCAB.get(i) or chr(ord("a") + i - 10))
    return "".join(out)


def _single(n=8):
    trajs = [Trajectory(group_id=i // 4, prompt_ids=[10], response_ids=[11] * (i + 1), logprobs=[0.0] * (i + 1),
                        finish_reason="stop" if i % 2 else "length", text=f"answer {i}", answer="4", prompt=f"q{i // 4}",
                        weight_version=7) for i in range(n)]
    rewards = [1.1 if i % 2 else 0.0 for i in range(n)]
    advantages = [[0.5 if i % 2 else -0.5] * (i + 1) for i in range(n)]
    return ScoredBatch(trajs, rewards, advantages, {"accuracy": [float(i % 2) for i in range(n)],
                                                    "format": [0.1 if i % 2 else 0.0 for i in range(n)]})


def test_due_and_pick_are_deterministic():
    assert [s for s in range(1, 17) if samples_due(s, 4)] == [4, 8, 12, 16]
    assert not any(samples_due(s, 0) for s in range(1, 17))
    assert pick(32, 4) == [0, 8, 16, 24] and pick(3, 8) == [0, 1, 2]


def test_single_turn_records():
    records = sample_records(5, _single(), 4, decode)
    assert [r["index"] for r in records] == [0, 2, 4, 6] and [r["group_id"] for r in records] == [0, 0, 1, 1]
    r = sample_records(5, _single(), 8, decode)[3]
    assert r == {"step": 5, "index": 3, "group_id": 0, "prompt": "q0", "completion": "answer 3", "answer": "4",
                 "reward": 1.1, "rewards": {"accuracy": 1.0, "format": 0.1}, "advantage": 0.5, "response_len": 4,
                 "finish_reason": "stop", "weight_version": 7, "turns": []}
    json.dumps(records)  # JSON-ready


def test_multi_turn_record_has_every_turn_with_its_role():
    # prompt: <|im_start|>user\n a b <|im_end|>\n <|im_start|>assistant\n
    prompt = [1, 3, 10, 11, 2, 6, 1, 5]
    # sampled "c d" + <|im_end|> (mask 1), then the tool's reply rendered by the template (mask 0), then sampled "e"
    response = [12, 13, 2, 6, 1, 4, 14, 2, 6, 1, 5, 15]
    mask = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    t = Trajectory(group_id=3, prompt_ids=prompt, response_ids=response, logprobs=[0.0] * 12, finish_reason="stop",
                   weight_version=2, multiturn=MultiTurnInfo(loss_mask=mask, turn_rewards=[0.0, 1.0], num_turns=2,
                                                             stop_reason="done"))
    adv = [0.7 if m else 0.0 for m in mask]
    (r,) = sample_records(9, ScoredBatch([t], [1.0], [adv], {}), 1, decode)
    assert r["turns"] == [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"},
                          {"role": "tool", "content": "e"}, {"role": "assistant", "content": "f"}]
    assert r["rewards"] == {"env": 1.0} and r["advantage"] == pytest.approx(0.7) and r["prompt"] == "user\nab\nassistant\n"
    assert chat_turns("plain text", "environment") == [{"role": "environment", "content": "plain text"}]


def test_tables():
    records = sample_records(5, _single(), 2, decode)
    columns, rows = table_rows(records)
    assert columns[:4] == ["step", "index", "group_id", "prompt"] and len(rows) == 2
    assert json.loads(rows[1][columns.index("rewards")]) == {"accuracy": 0.0, "format": 0.0}
    text = markdown_table([{**records[0], "completion": "a|b\nc"}])
    assert text.count("\n") == 2 and "a\\|b<br>c" in text


def test_samples_file_and_resume(tmp_path):
    cfg = load_config(None, [f"run.output_dir={tmp_path}", "metrics.samples_every=2", "metrics.samples_n=3"])

    class Sinks:
        def __init__(self, sink):
            self.sink = sink

        def log_samples(self, step, samples):
            self.sink.log_samples(step, samples)

    sink = SamplesFile(tmp_path / "samples.jsonl")
    for step in (1, 2, 3, 4):
        log_completion_samples(Sinks(sink), cfg.metrics, step, _single(), type("Tok", (), {"decode": staticmethod(decode)}))
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 2, 2, 4, 4, 4]
    SamplesFile(tmp_path / "samples.jsonl", start_step=3)  # a resume at step 3 drops step 4's samples
    assert [json.loads(x)["step"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [2, 2, 2]
    off = load_config(None, [f"run.output_dir={tmp_path}"])
    assert off.metrics.samples_every == 0 and SamplesFile.from_config(off, None) is None


def test_secrets_are_redacted_and_counts_are_not():
    assert is_secret("metrics.wandb.api_key") and is_secret("x.hf_token") and is_secret("db.password")
    assert is_secret("a.secret.value") and is_secret("a.b", redact=["a"]) and not is_secret("ab.c", redact=["a"])
    assert not is_secret("rollout.max_new_tokens") and not is_secret("checkpoint.keep_last")
    flat = flat_hparams({"a": {"api_key": "k", "n": 3, "l": [1, 2]}, "f": [{"name": "x"}]}, ["f.0"])
    assert flat == {"a.api_key": REDACTED, "a.n": 3, "a.l": "[1, 2]", "f.0.name": REDACTED}


def test_keys_from_the_environment_are_found_before_resolving(monkeypatch):
    raw = {"a": {"x": "${oc.env:HOME}", "y": "pre_${a.x}", "z": "plain", "w": ["${oc.env:USER,u}"]}, "b": "${a.z}"}
    assert env_sourced_keys(raw) == {"a.x", "a.y", "a.w"}
    monkeypatch.setenv("UNIT_PROJECT", "p-secret")
    cfg = load_config(None, ["metrics.wandb.project=${oc.env:UNIT_PROJECT}"])
    assert cfg.metrics.wandb.project == "p-secret" and "metrics.wandb.project" in cfg.metrics.redact


def test_demo_config_turns_tensorboard_and_samples_on():
    cfg = load_config("configs/grpo_arith_cpu.yaml")
    assert list(cfg.metrics.trackers) == ["tensorboard"] and cfg.metrics.samples_every > 0


def test_trackers_and_samples_leave_every_rng_stream_alone(tmp_path):
    """The demo's sinks (TensorBoard, samples.jsonl) and the sample picking draw no random numbers: the seeded
    run's prompts and rewards cannot change (`make demo` gives the same rewards per step)."""
    import random

    import numpy as np
    import torch

    from orchestrator.metrics.registry import build_sinks
    from orchestrator.metrics.sink import SinkContext

    cfg = load_config("configs/grpo_arith_cpu.yaml", [f"run.output_dir={tmp_path}", "metrics.sinks=[jsonl]",
                                                      "metrics.samples_every=1"])
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    tok = type("Tok", (), {"decode": staticmethod(decode)})
    with build_sinks(cfg, SinkContext(tmp_path, "unit", 2, 0)) as sinks:
        for step in (1, 2):
            sinks.log_row({"step": step, "reward/mean": 0.5})
            log_completion_samples(sinks, cfg.metrics, step, _single(), tok)
    assert torch.equal(before[0], torch.get_rng_state()) and (before[1] == np.random.get_state()[1]).all()
    assert before[2] == random.getstate()
    assert (tmp_path / "tensorboard").is_dir() and len((tmp_path / "samples.jsonl").read_text().splitlines()) == 8
