"""Shared by the Trainer unit tests: a tiny random Llama folder and a random GRPO batch."""
from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orchestrator.algo import TrainBatch


def save_tiny_llama(folder: Path) -> Path:
    """A 2-layer, hidden-64 random Llama (vocabulary 97, tied head) saved as an HF folder."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True, initializer_range=0.3)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def random_batch(n: int = 8, seed: int = 0) -> TrainBatch:
    """n samples: prompts of 2-6 ids, responses of 1-7 ids, rollout logprobs -4, advantages +-1."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 97) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    responses = [[rng.randrange(3, 97) for _ in range(rng.randint(1, 7))] for _ in range(n)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses],
                                               [rng.choice([-1.0, 1.0]) for _ in range(n)], ref_logprobs=None)


def shifted_batch(trainer, shift, n: int = 8, seed: int = 3) -> TrainBatch:
    """`random_batch(n, seed)` whose rollout (behaviour) logprobs are `trainer`'s current ones minus shift(i): every
    token of sample i has log(pi_trainer / pi_rollout) = shift(i)."""
    batch = random_batch(n, seed)
    current = trainer.logprobs(batch.prompt_ids, batch.response_ids)
    batch.rollout_logprobs = [[lp - shift(i) for lp in row] for i, row in enumerate(current)]
    return batch
