"""The weight-sync probe's full-distribution check on the default model (issue 37): what a correct engine gives, and
what a wrong logit outside the sampled tokens gives, so that `weight_sync.probe_kl_tolerance`'s defaults sit between.

One process: the HF model in float32 (the trainer's side, `probe_scores` as the trainer computes it) and one vLLM
engine per dtype (`--dtypes`, default float32 and bfloat16) on the same weights (`prompt_scores` with the run's
`weight_sync.probe_top_k`). Printed per dtype: the largest |logprob difference| over the probe's tokens and
`sync/probe_full_kl`. Then the negative control on the float32 engine's scores: the logits of the trainer's likeliest
and least likely non-probe token at each position traded (the sampled tokens' logprobs stay bit-equal), the KL it gives.

    .venv/bin/python benchmarks/probe_full_kl.py                 # about 1 min on 2 cores
    .venv/bin/python benchmarks/probe_full_kl.py --dtypes float32
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def swapped_engine_scores(trainer, top_k: int, probe_ids: set[int]):
    """The engine scores a correct engine would give (the trainer's rows) with, at every position, the logits of the
    likeliest and the least likely non-probe token traded: its top-k and the continuation token's logprob."""
    import torch

    from orchestrator.weight_sync.probe import ProbeScores

    rows = trainer.rows.clone()
    others = torch.tensor(sorted(set(range(rows.shape[1])) - probe_ids))
    for t in range(rows.shape[0]):
        sub = rows[t, others]
        a, b = others[int(sub.argmax())], others[int(sub.argmin())]
        rows[t, [a, b]] = rows[t, [b, a]]
    top = [{int(i): float(row[i]) for i in torch.topk(row, top_k).indices} for row in rows]
    return ProbeScores(list(trainer.logprobs), top=top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    from orchestrator.runtime.ray_connect import QUIET_ENV

    os.environ.update(QUIET_ENV)
    import torch
    from transformers import AutoModelForCausalLM

    from actors.rollout.vllm_engine import VLLMEngine
    from actors.model.forward import probe_scores
    from orchestrator.config.load import load_config
    from orchestrator.controller import GRPOController
    from orchestrator.weight_sync.probe import compare_probe, probe_full_kl, probe_tokens

    out = tempfile.mkdtemp(prefix="probe_full_kl_")
    ctl = GRPOController(load_config(str(ROOT / "configs/grpo_arith_cpu.yaml"), [f"run.output_dir={out}"]))
    k = ctl.cfg.weight_sync.probe_top_k
    model = AutoModelForCausalLM.from_pretrained(str(ctl.model_path), torch_dtype=torch.float32).eval()
    for dtype in args.dtypes:
        cfg = load_config(str(ROOT / "configs/grpo_arith_cpu.yaml"), [f"run.output_dir={out}", f"rollout.dtype={dtype}"])
        engine = VLLMEngine(str(ctl.model_path), cfg.rollout, cfg.rollout.seed)
        tokenizer = engine.tokenizer
        prompt, cont = probe_tokens(lambda s: tokenizer.encode(s, add_special_tokens=False))
        trainer = probe_scores(model, prompt, cont, "fp32", 0, rows=True)
        got = engine.prompt_scores(prompt + cont, len(prompt), k)
        diff = max(abs(a - b) for a, b in zip(got.logprobs, trainer.logprobs))
        print(f"engine {dtype:9} top_k {k}: probe max |logprob diff| {diff:.3g} nats, "
              f"sync/probe_full_kl {probe_full_kl(got.top, trainer.rows):.3g} nats", flush=True)
        if dtype == "float32":
            bad = swapped_engine_scores(trainer, k, set(prompt) | set(cont))
            print(f"negative control (likeliest and least likely non-probe token traded at each position): probe max "
                  f"|logprob diff| {compare_probe(bad.logprobs, trainer.logprobs, 1e-3, 'control'):.3g} nats, "
                  f"sync/probe_full_kl {probe_full_kl(bad.top, trainer.rows):.3g} nats", flush=True)
        del engine
    return 0


if __name__ == "__main__":
    sys.exit(main())
