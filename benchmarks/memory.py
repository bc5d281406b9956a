"""Memory planner estimate against the measured peak of training the default model on CPU (issue 6).

    .venv/bin/python benchmarks/memory.py                 # all three: about 18 CPU-minutes on 2 cores
    .venv/bin/python benchmarks/memory.py --only fp32-ckpt

Each configuration runs in a fresh subprocess: SmolLM2-135M-Instruct in fp32 (as actors.trainer loads
it), AdamW, one small warm-up update (creates the optimizer states), then the measured update: two
micro-batches (so gradients are held while the second one's activations are; the last sequence of a
micro-batch is 16 tokens shorter, so there is padding and an attention mask) through the trainer's
own forward (`actors.model.forward.forward_logprobs`: response positions only to logits), the token-mean
loss, backward, gradient clipping and the AdamW step.

Tracker: torch's `MemTracker` (torch.distributed._tools.mem_tracker), a dispatch-mode tracker that
sees every tensor storage the process allocates and frees, on CPU as on GPU, and records the peak of
their sum (it also splits it into parameters, gradients, optimizer states and activations). It
measures what the planner estimates: tensor bytes. Peak RSS (minus the RSS after imports) is printed
beside it for reference; it adds the allocator's slack and whatever the libraries allocate outside
tensors (the planner's `runtime` term, which is left out of the comparison here).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name: (precision, attention, micro_batch_size, seq_len, response_len, gradient_checkpointing)
CONFIGS = {
    "fp32-sdpa": ("fp32", "sdpa", 2, 256, 128, False),
    "fp32-sdpa-ckpt": ("fp32", "sdpa", 2, 256, 128, True),
    "bf16-eager": ("bf16-autocast", "eager", 1, 512, 256, False),
}


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure(name: str) -> dict:
    """Run one configuration in this process; returns the tracker's peak bytes (and its split) and RSS."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    from actors.model.forward import collate, forward_logprobs
    from orchestrator.utils.models import resolve_model_path

    precision, attention, mbs, seq, resp, ckpt = CONFIGS[name]
    torch.manual_seed(0)
    path = resolve_model_path("default")
    rss0 = _rss_bytes()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attention)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    tracker = MemTracker()
    tracker.track_external(model, opt)
    vocab = model.config.vocab_size

    def update(batch: int, length: int, response: int, micro_batches: int) -> None:
        opt.zero_grad(set_to_none=True)
        for _ in range(micro_batches):
            tracker.reset_mod_stats()  # per-module stats are per call; the process-wide peak is kept
            prompts = torch.randint(0, vocab, (batch, length - response)).tolist()
            # the last sample's response is shorter, as in real batches: padding, so an attention mask
            responses = [r[: response - 16 * (i == batch - 1 and batch > 1)]
                         for i, r in enumerate(torch.randint(0, vocab, (batch, response)).tolist())]
            mb = collate(prompts, responses)
            lp = forward_logprobs(model, mb, 1.0, precision)
            loss = -(lp * mb.mask).sum() / mb.mask.sum() / micro_batches
            loss.backward()
            del lp, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()

    with tracker:
        update(1, 8, 4, 1)  # warm-up: the optimizer states exist from here on, as in a running trainer
        update(mbs, seq, resp, 2)
        peak = tracker.get_tracker_snapshot("peak")
    cpu = next(v for k, v in peak.items() if str(k) == "cpu")
    return {"name": name, "peak_bytes": cpu["Total"], "parts": {str(k).split(".")[-1]: v for k, v in cpu.items()},
            "rss_delta_bytes": _rss_bytes() - rss0}


def estimate(name: str) -> dict:
    """The planner's trainer estimate (tensor bytes: runtime left out) for the configuration."""
    from orchestrator.memory.estimate import RunShape, trainer_bytes
    from orchestrator.memory.params import load_hf_config
    from orchestrator.memory.shapes import model_shape
    from orchestrator.utils.models import resolve_model_path

    precision, attention, mbs, seq, resp, ckpt = CONFIGS[name]
    shape = model_shape(load_hf_config(resolve_model_path("default")), "SmolLM2-135M-Instruct")
    run = RunShape(device="cpu", precision=precision, attention=attention, micro_batch_size=mbs, seq_len=seq,
                   response_len=resp, gradient_checkpointing=ckpt, frozen_bytes=4, engines=0)
    parts = trainer_bytes(shape, run)
    parts.pop("runtime")
    return {"bytes": sum(parts.values()), "parts": parts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=list(CONFIGS), help="one configuration")
    ap.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    names = [args.only] if args.only else list(CONFIGS)
    mib = 2 ** 20
    print(f"{'config':16} {'precision':14} {'attn':6} {'mbs x seq':10} {'ckpt':5} {'estimate MiB':>12} "
          f"{'measured MiB':>12} {'est/meas':>8} {'RSS+ MiB':>9}")
    worst = 0.0
    for name in names:
        out = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        got = json.loads(out.stdout.strip().splitlines()[-1])
        est = estimate(name)
        precision, attention, mbs, seq, _, ckpt = CONFIGS[name]
        ratio = est["bytes"] / got["peak_bytes"]
        worst = max(worst, abs(ratio - 1))
        print(f"{name:16} {precision:14} {attention:6} {f'{mbs} x {seq}':10} {str(ckpt):5} {est['bytes'] / mib:12.0f} "
              f"{got['peak_bytes'] / mib:12.0f} {ratio:8.3f} {got['rss_delta_bytes'] / mib:9.0f}")
        print("    estimate parts MiB: " + ", ".join(f"{k} {v / mib:.0f}" for k, v in est["parts"].items() if v))
        print("    measured at peak MiB: " + ", ".join(f"{k} {v / mib:.0f}" for k, v in got["parts"].items()
                                                         if v and k != "Total"))
    print(f"largest deviation: {worst:.1%} (target: within 15%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
