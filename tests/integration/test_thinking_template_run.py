"""Multi-turn GRPO with Qwen3's real chat template (tests/fixtures/chat_templates/qwen3.jinja: it strips past
<think> reasoning and renders tools through tools=) on the tiny model, env.render_mode=incremental, 2 steps on CPU.

Checks: the trained ids (loss mask 1) are exactly the sampled ids, turn by turn the ids whose text the
environment received; every observation id is present and masked (logprob 0.0) and is the Qwen3 template's
rendering of the new message: the turn's closing text, the <tool_response> block or the user turn, and the
generation prompt; the prompt lists the tool through the template's own tools= rendering.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from transformers import AutoTokenizer

from orchestrator.config import load_config
from orchestrator.controller import GRPOController
from orchestrator.rollout.chat_render import ChatRenderer
from tests.integration.conftest import tiny_overrides
from tests.unit.template_helpers import load_template

pytestmark = pytest.mark.integration


class RecordingController(GRPOController):
    """Keeps every step's trained trajectories."""

    def train(self, trajs, advantages, ref):
        self.seen = getattr(self, "seen", []) + [trajs]
        return super().train(trajs, advantages, ref)


def qwen3_model(tiny_model, tmp_path):
    folder = tmp_path / "tiny_qwen3_template"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(load_template("qwen3"), encoding="utf-8")
    return folder


def test_qwen3_template_multiturn_grpo(ray_local, tiny_model, tmp_path):
    model = qwen3_model(tiny_model, tmp_path)
    tok = AutoTokenizer.from_pretrained(model)
    assert tok.chat_template == load_template("qwen3") and tok.eos_token == "<|im_end|>"  # SmolLM2's ChatML tokens
    record = tmp_path / "actions.jsonl"
    env = ["env.name=tests.integration.multiturn_envs:ToolThenUserEnv", f"env.kwargs={{record: {record}}}",
           "env.render_mode=incremental", "env.max_turns=3", "env.max_tokens=700", "rollout.max_new_tokens=10",
           "rollout.block_size=32", "env.step_timeout_s=20"]
    cfg = load_config("configs/grpo_guessing_cpu.yaml", tiny_overrides(model, tmp_path) + env)
    controller = RecordingController(cfg)
    try:
        result = controller.run()
    finally:
        controller.shutdown()
    rows = [json.loads(line) for line in open(result.metrics)]
    assert [r["step"] for r in rows] == [1, 2] and all(r["env/errors"] == 0 for r in rows)

    session = ChatRenderer(tok, "incremental").start([{"role": "user", "content": "q"}])  # the worker's action_text
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    trained_texts = []
    for t in (t for step in controller.seen for t in step):
        prompt = tok.decode(t.prompt_ids)
        assert prompt.startswith("<|im_start|>system\nYou are terse.\n\n# Tools") and '"name": "lookup"' in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        mask, ids = t.multiturn.loss_mask, t.response_ids
        spans = _runs(mask)  # the sampled turns: observation ids always separate them
        assert len(mask) == len(ids) == len(t.logprobs) and len(spans) == t.multiturn.num_turns
        assert all((lp < 0.0) if m else (lp == 0.0) for lp, m in zip(t.logprobs, mask))
        for k, (a, b) in enumerate(spans):
            trained_texts.append((k + 1, session.action_text(ids[a:b])))
            if k + 1 < len(spans):  # the observation between turn k+1 and k+2: every id present, masked
                close = "\n" if ids[b - 1] == im_end else "<|im_end|>\n"
                reply = ("<|im_start|>user\n<tool_response>\nresult 1\n</tool_response><|im_end|>\n" if k == 0
                         else "<|im_start|>user\nGo on.<|im_end|>\n")
                assert tok.decode(ids[b:spans[k + 1][0]]) == close + reply + "<|im_start|>assistant\n"
    assert max(k for k, _ in trained_texts) == 3
    recorded = [json.loads(line) for line in open(record)]
    # every turn the environment received is a trained turn and vice versa (the sampled ids, as sampled)
    assert Counter((r["turn"], r["action"]) for r in recorded) == Counter(trained_texts) and len(recorded) >= 16


def _runs(mask: list) -> list:
    """(start, end) of each run of 1s in `mask`."""
    edges = [i for i in range(len(mask) + 1) if (mask[i] if i < len(mask) else 0) != (mask[i - 1] if i else 0)]
    return list(zip(edges[::2], edges[1::2]))
