"""The trainer's GRPO step on a GPU: step time, model FLOP/s against the bf16 matrix rate measured in the same run,
and the memory planner's trainer estimate against torch.cuda.max_memory_allocated.

    python benchmarks/gpu_trainer.py [--steps 4] [--samples 64] [--prompt 128] [--response 512]
                                     [--micro-batch 8] [--precision bf16-autocast] [--ckpt] [--json out.json]

The policy is a randomly initialised Llama of the default model's shape (SmolLM2-135M-Instruct: 30 layers, hidden
576, 9 heads, 3 KV heads, MLP 1536, vocabulary 49152, tied head; the weights do not change the timing or the
memory), trained by `actors.trainer.trainer.Trainer` itself: `--samples` sequences per step with prompts of
`--prompt` tokens and responses of `--response` tokens or fewer (uniform in [response/2, response], as a batch's
lengths vary), advantages +-1, micro-batches of `--micro-batch`. Step 1 is warm-up (CUDA kernels chosen, the
optimizer state created); steps 2..N are timed with a synchronize on either side of `train_step`.

Printed per configuration:
- seconds per step (median of steps 2..N) and trained tokens per second;
- model FLOP/s: 6 N T per step (N parameters, T tokens: forward 2NT, backward 4NT; Kaplan et al. 2020, "Scaling
  Laws for Neural Language Models", section 2.1) over the step time, against a bf16 8192^3 matrix product timed in
  the same process (the device's practical peak), as a ratio (MFU; the response-only logits make 6 N T an
  over-count of the head's share, so the ratio is an upper bound of the useful work);
- the peak of torch.cuda.max_memory_allocated over steps 2..N, above the memory held before the model loaded,
  against `orchestrator.memory.estimate.trainer_bytes` without its `runtime` term (the CUDA context, which the
  caching allocator does not see), as a ratio (target within 15%).
On a machine without CUDA it runs on the CPU (for a smoke run of the script); the memory and MFU columns are
then left out.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                     max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, model_type="llama")


def matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """bf16 n x n x n matrix products per second on the GPU, in TFLOP/s (2 n^3 each; mean of `repeats` after three
    warm-ups, random normal data)."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12


def _batch(args, seed: int):
    from orchestrator.algo import TrainBatch

    rng = random.Random(seed)
    vocab = DEFAULT_SHAPE["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(args.samples)]
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randint(args.response // 2, args.response))]
                 for _ in range(args.samples)]
    return TrainBatch.with_sequence_advantages(prompts, responses, [[-4.0] * len(r) for r in responses],
                                               [rng.choice([-1.0, 1.0]) for _ in range(args.samples)],
                                               ref_logprobs=None)


def _trainer(folder: Path, args):
    from omegaconf import OmegaConf

    from actors.trainer.trainer import Trainer
    from orchestrator.config.schema import AlgoConfig, TrainerConfig

    tc = OmegaConf.structured(TrainerConfig)
    tc.update({"lr": 1e-6, "warmup_steps": 0, "micro_batch_size": args.micro_batch, "precision": args.precision,
               "gradient_checkpointing": args.ckpt, "attn_implementation": "sdpa"})
    return Trainer(str(folder), tc, OmegaConf.structured(AlgoConfig), temperature=1.0, max_new_tokens=args.response)


def _estimate_bytes(args, attention: str) -> int:
    from orchestrator.memory.estimate import RunShape, trainer_bytes
    from orchestrator.memory.shapes import model_shape

    shape = model_shape(dict(DEFAULT_SHAPE), "smollm2-135m-shape")
    run = RunShape(device="gpu", precision=args.precision, micro_batch_size=args.micro_batch,
                   seq_len=args.prompt + args.response, response_len=args.response,
                   gradient_checkpointing=args.ckpt, attention=attention, engines=0, reference=False)
    parts = trainer_bytes(shape, run)
    return sum(parts.values()) - parts["runtime"]


def run(args) -> dict:
    """One configuration: returns its row (seconds, tokens/s, TFLOP/s, MFU, memory) as a dict."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**DEFAULT_SHAPE)).save_pretrained(folder)
        trainer = _trainer(Path(folder), args)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    times, tokens = [], []
    for step in range(args.steps):
        batch = _batch(args, seed=step)
        if step == 1 and cuda:
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.train_step(batch)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(sum(len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)))
    step_s = statistics.median(times[1:]) if len(times) > 1 else times[0]
    step_tokens = statistics.median(tokens[1:]) if len(tokens) > 1 else tokens[0]
    row = {"precision": args.precision, "ckpt": args.ckpt, "samples": args.samples, "micro_batch": args.micro_batch,
           "prompt": args.prompt, "response": args.response, "params": n_params, "step1_s": times[0],
           "step_s": step_s, "tokens_per_s": step_tokens / step_s}
    estimate = _estimate_bytes(args, trainer.model.config._attn_implementation)
    row["mem_estimate_mib"] = estimate / 2 ** 20
    if cuda:
        measured = torch.cuda.max_memory_allocated() - base
        flops = 6 * n_params * step_tokens / step_s / 1e12
        peak = matmul_tflops()
        row.update({"model_tflops": flops, "matmul_tflops": peak, "mfu": flops / peak,
                    "mem_measured_mib": measured / 2 ** 20, "mem_ratio": estimate / measured})
    del trainer
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--precision", default="bf16-autocast", choices=("fp32", "bf16-autocast", "fp8"))
    ap.add_argument("--ckpt", action="store_true", help="gradient checkpointing")
    ap.add_argument("--json", help="append the row to this file (one JSON object per line)")
    args = ap.parse_args()
    if min(args.steps, args.samples, args.prompt, args.response, args.micro_batch) < 1:
        ap.error("--steps, --samples, --prompt, --response and --micro-batch must be >= 1")
    row = run(args)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
