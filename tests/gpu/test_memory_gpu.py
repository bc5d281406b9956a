"""The planner's trainer estimate against torch.cuda.max_memory_allocated for a small random Llama.

One update as the trainer does it (two micro-batches through actors.model.forward.forward_logprobs, backward,
gradient clipping, foreach AdamW) after a warm-up update that creates the optimizer states. The
estimate leaves out the `runtime` term (CUDA context, not seen by the caching allocator).
"""
import pytest
import torch

from orchestrator.memory.estimate import RunShape, trainer_bytes
from orchestrator.memory.shapes import model_shape


def _update(model, opt, batch: int, length: int, response: int, precision: str, micro_batches: int) -> None:
    from actors.model.forward import collate, forward_logprobs

    opt.zero_grad(set_to_none=True)
    vocab = model.config.vocab_size
    for _ in range(micro_batches):
        prompts = torch.randint(0, vocab, (batch, length - response)).tolist()
        # the last sample's response is shorter, as in real batches: padding, so an attention mask
        responses = [r[: response - 16 * (i == batch - 1 and batch > 1)]
                     for i, r in enumerate(torch.randint(0, vocab, (batch, response)).tolist())]
        mb = collate(prompts, responses)
        lp = forward_logprobs(model, mb, 1.0, precision)
        loss = -(lp * mb.mask.cuda()).sum() / mb.mask.sum().cuda() / micro_batches
        loss.backward()
        del lp, loss
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


@pytest.mark.gpu
@pytest.mark.parametrize("precision,ckpt", [("fp32", False), ("bf16-autocast", False), ("fp32", True)])
def test_estimate_within_15_percent_of_max_memory_allocated(precision, ckpt):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
              num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = LlamaForCausalLM(LlamaConfig(**hf)).cuda()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch, length, response = 4, 512, 256
    _update(model, opt, 1, 8, 4, precision, 1)  # creates the optimizer states
    torch.cuda.reset_peak_memory_stats()
    _update(model, opt, batch, length, response, precision, 2)
    measured = torch.cuda.max_memory_allocated() - base

    shape = model_shape(dict(hf, model_type="llama"), "tiny-llama")
    run = RunShape(device="gpu", precision=precision, micro_batch_size=batch, seq_len=length, response_len=response,
                   gradient_checkpointing=ckpt, attention=model.config._attn_implementation, engines=0)
    parts = trainer_bytes(shape, run)
    estimate = sum(parts.values()) - parts["runtime"]
    print(f"{precision} ckpt={ckpt}: estimate {estimate / 2**20:.0f} MiB, measured {measured / 2**20:.0f} MiB, "
          f"ratio {estimate / measured:.3f}")
    assert abs(estimate / measured - 1) <= 0.15
