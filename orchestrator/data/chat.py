"""Render prompts with the model's chat template into token ids (the rollout's input)."""
from __future__ import annotations

from typing import Optional


def render_prompt_ids(tokenizer, prompt: str, system_prompt: Optional[str] = None, max_tokens: int = 0) -> list[int]:
    """Token ids of `prompt` as one user turn plus the generation prompt of the chat template.

    Models without a chat template get the raw prompt text. Raises ValueError when the result is
    longer than `max_tokens` (> 0), naming the prompt.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        if system_prompt is not None:
            messages.insert(0, {"role": "system", "content": system_prompt})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        ids = list(ids)
    else:
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if max_tokens and len(ids) > max_tokens:
        raise ValueError(f"prompt {prompt[:60]!r}... renders to {len(ids)} tokens > data.max_prompt_tokens={max_tokens}")
    return ids


def render_row(tokenizer, data_cfg, prompt: str, where: str) -> list[int]:
    """`render_prompt_ids` with the `data` section's system_prompt and max_prompt_tokens; its ValueError is raised
    again prefixed with `where` (the row, e.g. "data.source='arith' row 3"), so the error names the input."""
    try:
        return render_prompt_ids(tokenizer, prompt, data_cfg.system_prompt, data_cfg.max_prompt_tokens)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
