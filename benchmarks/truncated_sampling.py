"""Rollout/trainer logprob gap under truncated sampling (issue 37): a real vLLM engine samples with top-p / top-k,
the trainer scores the same tokens before (full softmax at the temperature) and after (the sampler's kept set
replayed: orchestrator/algo/sampler_support.py).

One process: one vLLM engine (the run's engine settings: `logprobs_mode="processed_logprobs"`, float32 on CPU) and
the HF model in float32. For each setting, the controller's prompts of `--steps` steps (`rollout.prompts_per_step` x
`rollout.n` samples, seeded as a run seeds them) are sampled; every sampled token's engine logprob is compared with
the trainer's. Printed per setting: tokens, mean and max |rollout - trainer| in nats, and the mean and min on-policy
ratio exp(trainer - rollout), before and after.

    .venv/bin/python benchmarks/truncated_sampling.py [--steps 2] [key=value ...]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETTINGS = {"top_p=1.0": [], "top_p=0.8": ["rollout.top_p=0.8"], "top_k=20": ["rollout.top_k=20"]}


def gaps(model, trajs, sampling) -> "torch.Tensor":
    """Per sampled token: trainer logprob (under `sampling`) minus the engine's, over every trajectory."""
    import torch

    from orchestrator.algo import token_logprobs

    out = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([list(t.prompt_ids) + list(t.response_ids)])
            logits = model(ids).logits[:, len(t.prompt_ids) - 1 : -1]
            lp = token_logprobs(logits, torch.tensor([list(t.response_ids)]), sampling)[0]
            out.append(lp - torch.tensor(t.logprobs))
    return torch.cat(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from orchestrator.runtime.ray_connect import QUIET_ENV

    os.environ.update(QUIET_ENV)
    import torch
    from transformers import AutoModelForCausalLM

    from actors.rollout.vllm_engine import VLLMEngine
    from benchmarks import bare_vllm
    from orchestrator.algo import SamplerSettings
    from orchestrator.config.load import load_config
    from orchestrator.controller import GRPOController

    out = tempfile.mkdtemp(prefix="truncated_sampling_")
    base = [f"run.output_dir={out}", "rollout.dtype=float32", *args.overrides]
    ctl = GRPOController(load_config(str(ROOT / "configs/grpo_arith_cpu.yaml"), base))  # no actors: prompts only
    model = AutoModelForCausalLM.from_pretrained(str(ctl.model_path), torch_dtype=torch.float32).eval()
    engine = None
    print(f"{'setting':10} {'tokens':>6} | {'before: mean |gap|':>18} {'max':>8} {'ratio mean':>10} {'min':>6} | "
          f"{'after: mean |gap|':>17} {'max':>8} {'ratio mean':>10} {'min':>6}")
    for name, extra in SETTINGS.items():
        cfg = load_config(str(ROOT / "configs/grpo_arith_cpu.yaml"), base + extra)
        if engine is None:
            engine = VLLMEngine(str(ctl.model_path), cfg.rollout, cfg.rollout.seed)
        engine.cfg = cfg.rollout  # the sampling params of this setting (one engine for all)
        trajs = [t for s in range(1, args.steps + 1)
                 for t in bare_vllm.generate(engine.llm, cfg.rollout, ctl.sample_prompts(s), cfg.rollout.n)]
        sampler = SamplerSettings.from_rollout(cfg.rollout)
        row = [name, f"{sum(len(t.response_ids) for t in trajs):6d}"]
        for sampling in (sampler.temperature, sampler):
            g = gaps(model, trajs, sampling)
            r = g.exp()
            row.append(f"{g.abs().mean():18.3g} {g.abs().max():8.3g} {r.mean():10.4f} {r.min():6.3f}")
        print(f"{row[0]:10} {row[1]} | {row[2]} | {row[3]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
