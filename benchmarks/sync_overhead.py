"""The two avoidable costs of the object-store weight sync found by benchmarks/profile_step.py (issue 7),
old way against new way on the default model's weights (538 MB fp32, tied head left out), alternated.

1. Checksums (orchestrator/weight_sync/checksum.py; taken once by the trainer and once by the engine on every
   sync, `weight_sync.verify`) of the trainer's list (the tied head listed again as lm_head): the old
   whole-tensor float64 copy plus `x * x` temporary, every name summed, against the chunked float64
   sums now used, a tensor listed twice summed once.
2. Object-store transfer trainer actor -> engine actor: a plain list of (name, tensor) (torch pickles
   each storage in-band) against `SharedTensors` (actors/weight_sync/zero_copy.py: raw out-of-band
   buffers, mapped by the reader without a copy). Timed at the driver from the call to the receiver's
   answer; the receiver touches every tensor (a sum) so a lazy mapping cannot hide a cost.

    .venv/bin/python benchmarks/sync_overhead.py [--repeats 3] [--part all|checksums|transfer]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def default_weights() -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    from orchestrator.utils.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("default"), dtype=torch.float32)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return [(k, v.detach().contiguous()) for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")]


def old_checksums(named) -> dict:
    """The checksum before issue 7 (kept here only to measure against)."""
    from orchestrator.weight_sync.checksum import checksum_group

    out: dict = {}
    for name, t in named:
        x = t.detach().to(torch.float64)
        acc = out.setdefault(checksum_group(name), [0.0, 0.0, 0.0])
        acc[0] += float(x.sum())
        acc[1] += float((x * x).sum())
        acc[2] += float(x.numel())
    return out


def bench_checksums(named, repeats: int) -> None:
    from orchestrator.weight_sync.checksum import compare_checksums, group_checksums

    # what the trainer checksums (actors/trainer/trainer.py weights_for_sync): the tied head again, as lm_head
    named = named + [("lm_head.weight", t) for k, t in named if k == "model.embed_tokens.weight"]
    old_s, new_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a = old_checksums(named)
        t1 = time.perf_counter()
        b = group_checksums(named)
        t2 = time.perf_counter()
        old_s.append(t1 - t0)
        new_s.append(t2 - t1)
        compare_checksums(a, b, where="old vs new")  # same values within the verification tolerance
    print(f"checksums of {len(named)} tensors: old {_fmt(old_s)}  new {_fmt(new_s)}  "
          f"new/old {sum(new_s) / sum(old_s):.3f}", flush=True)


def bench_transfer(named, repeats: int) -> None:
    import ray

    from actors.weight_sync.zero_copy import SharedTensors

    @ray.remote
    class Sender:
        def __init__(self, named):
            self.named = [(n, t.clone()) for n, t in named]

        def weights(self, shared: bool):
            return SharedTensors(self.named) if shared else list(self.named)

    @ray.remote
    class Receiver:
        def consume(self, named) -> float:
            return float(sum(t.sum() for _, t in named))

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    sender, receiver = Sender.remote(named), Receiver.remote()
    ray.get(receiver.consume.remote([]))
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    for r in range(repeats + 1):  # the first round warms both paths up
        for kind in ("plain", "shared"):
            t0 = time.perf_counter()
            total = ray.get(receiver.consume.remote(sender.weights.remote(kind == "shared")))
            if r:
                times[kind].append(time.perf_counter() - t0)
    ray.shutdown()
    print(f"object-store transfer of {sum(t.numel() * t.element_size() for _, t in named) / 1e6:.0f} MB "
          f"(receiver sum {total:.4g}): plain {_fmt(times['plain'])}  SharedTensors {_fmt(times['shared'])}  "
          f"shared/plain {sum(times['shared']) / sum(times['plain']):.3f}", flush=True)


def _fmt(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.3f} s ({' '.join(f'{x:.2f}' for x in xs)})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--part", choices=("all", "checksums", "transfer"), default="all")
    args = ap.parse_args(argv)
    named = default_weights()
    if args.part in ("all", "checksums"):
        bench_checksums(named, args.repeats)
    if args.part in ("all", "transfer"):
        bench_transfer(named, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
