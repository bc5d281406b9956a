"""A learned reward: an HF sequence-classification model from a local folder scores (prompt, completion).

Used by the RewardActor when `reward.model_path` is set; its score (the logit of a one-label head, or
`label_index` of a multi-label head) is added to the rule-based rewards with `reward.model_weight`.
The conversation is rendered with the reward model's own chat template when it has one, otherwise
as prompt + completion text, so policy and reward model may use different tokenizers.
"""
from __future__ import annotations

import math
from pathlib import Path


class RewardModelScorer:
    """Scores texts with `AutoModelForSequenceClassification` (fp32 on CPU, the model's device on GPU).

    Raises FileNotFoundError when `path` holds no config.json; ValueError for mismatched input lengths
    or a non-finite score (naming the sample).
    """

    def __init__(self, path: str, batch_size: int = 8, max_length: int = 1024, label_index: int = 0):
        import torch  # here, not at import: the reward actor without a reward model never loads torch (~2 s)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"reward.model_path={path!r} is not a local HF model folder (no config.json)")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.label_index = batch_size, max_length, label_index

    def render(self, prompt: str, completion: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return prompt + completion

    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """One float per (prompt, completion), in order."""
        import torch

        if len(prompts) != len(completions):
            raise ValueError(f"reward model: {len(prompts)} prompts for {len(completions)} completions")
        texts = [self.render(p, c) for p, c in zip(prompts, completions)]
        out: list[float] = []
        device = next(self.model.parameters()).device
        for s in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[s : s + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length).to(device)
            with torch.no_grad():
                logits = self.model(**enc).logits.float()
            out.extend(logits[:, self.label_index].tolist())
        for i, v in enumerate(out):
            if not math.isfinite(v):
                raise ValueError(f"reward model gave a non-finite score {v} for sample {i}")
        return out
