"""Tokenizers for the real chat templates in tests/fixtures/chat_templates/ (no weights, no network).

`template_tokenizer(name)` builds a byte-level BPE tokenizer with no merges (every byte one token, so any
text encodes) plus the special tokens the template writes, wrapped in `PreTrainedTokenizerFast` with the
template as its chat_template. The fixture's first line is a Jinja comment naming the template's source; the
chat_template is the rest of the file, byte for byte.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"

_CHATML = {"eos": "<|im_end|>", "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]}
_QWEN = {**_CHATML, "plain": ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]}
SPECS = {
    "qwen3": _QWEN,
    "qwen2_5": _QWEN,
    "smollm2": _CHATML,
    "deepseek_r1_distill_qwen": {
        "bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>",
        "special": ["<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                    "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"],
        "plain": ["<think>", "</think>"]},
    "llama3_1": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>",
                 "special": ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"]},
    "mistral_v0_3": {"bos": "<s>", "eos": "</s>",
                     "special": ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                 "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]},
}


def load_template(name: str) -> str:
    """The template string of fixture `name` (its source comment line removed)."""
    text = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
    header, template = text.split("\n", 1)
    assert header.startswith("{#- source: ") and header.endswith("-#}"), f"{name}: no source header"
    return template


def template_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with the special tokens of template `name` and that template as chat_template."""
    spec = SPECS[name]
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    extra = [t for t in spec["special"] if t not in (spec.get("bos"), spec["eos"])]
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=spec.get("bos"), eos_token=spec["eos"],
                                  additional_special_tokens=extra)
    tok.add_tokens(spec.get("plain", []))
    tok.chat_template = load_template(name)
    return tok
