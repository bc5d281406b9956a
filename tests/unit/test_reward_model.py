"""The optional learned reward: a local HF sequence-classification model scores (prompt, completion)."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from orchestrator.utils.models import resolve_model_path
from orchestrator.reward.model import RewardModelScorer


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id,
                      initializer_range=0.2)
    folder = tmp_path_factory.mktemp("rm")
    LlamaForSequenceClassification(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_scores_are_finite_deterministic_and_batch_independent(rm_folder):
    rm = RewardModelScorer(str(rm_folder), batch_size=2)
    prompts = ["What is 2 + 2?", "What is 3 * 3?", "Name a color."]
    completions = ["4", "The answer is 9, since 3 * 3 = 9.", "blue"]
    a = rm.score(prompts, completions)
    b = RewardModelScorer(str(rm_folder), batch_size=3).score(prompts, completions)
    assert len(a) == 3 and all(math.isfinite(x) for x in a)
    assert a == pytest.approx(b, abs=1e-4)  # padding / batch split does not change a score
    assert len(set(round(x, 5) for x in a)) == 3  # different texts get different scores
    assert rm.score(prompts[:1], completions[:1]) == pytest.approx(a[:1], abs=1e-4)


def test_renders_the_conversation_with_the_chat_template(rm_folder):
    rm = RewardModelScorer(str(rm_folder))
    text = rm.render("What is 2 + 2?", "4")
    assert "What is 2 + 2?" in text and text.rstrip().endswith("<|im_end|>") and "assistant\n4" in text


def test_bad_inputs_fail_clearly(rm_folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="reward.model_path"):
        RewardModelScorer(str(tmp_path))
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        RewardModelScorer(str(rm_folder)).score(["a", "b"], ["c"])
