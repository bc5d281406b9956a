"""vLLM CPU engine compiled (`rollout.enforce_eager=false`) against eager: start-up, decode speed, and that a
weight reload through our worker extension reaches the compiled model.

    .venv/bin/python benchmarks/compiled_engine.py            # both modes, one after the other (~5 min)
    .venv/bin/python benchmarks/compiled_engine.py --modes eager

Per mode, in this process (in-process engine, as the rollout actor runs it; fp32, the default model):
1. engine start-up seconds (the compiled engine runs torch.compile here);
2. the summed prompt logprobs of 4 chat prompts, before and after an object-store `weight_sync` load (the worker
   extension's entry point) with every matrix perturbed by 0.3 x its std (seeded): they must change, and
   must equal the other mode's after the same reload;
3. decode: 4 prompts x n=8 x 48 tokens (ignore_eos), timed over `--rounds` calls after the reload.
Prints one line per measurement and, with both modes, the logprob agreement and the decode speed ratio.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_mode(mode: str, rounds: int) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams

    from orchestrator.utils.models import resolve_model_path

    path = str(resolve_model_path("default"))
    t0 = time.perf_counter()
    llm = LLM(model=path, dtype="float32", enforce_eager=(mode == "eager"), max_model_len=1024, seed=0,
              worker_extension_cls="actors.weight_sync.vllm_extension.WeightReceiverExtension",
              weight_transfer_config={"backend": "rl_orch"})
    startup = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {a + 1}? Give the final answer "
                                         "as a number at the end."}], tokenize=False, add_generation_prompt=True)
               for a in range(4)]

    def prompt_logprobs() -> list[float]:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        return [sum(next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]) for o in outs]

    before = prompt_logprobs()
    state: dict = {}
    for f in glob.glob(path + "/*.safetensors"):
        state.update(load_file(f))
    gen = torch.Generator().manual_seed(1)
    named = [(k, v + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype) * v.float().std())
             if v.dim() == 2 else (k, v) for k, v in state.items()]
    llm.collective_rpc("start_weight_update")  # vLLM's weight-transfer protocol (actors/weight_sync/transfer_engine.py)
    llm.collective_rpc("update_weights", args=({"strategy": "object_store", "payload": named, "version": 1},))
    llm.collective_rpc("finish_weight_update")
    after = prompt_logprobs()
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=48, ignore_eos=True, logprobs=0)
    decode = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = llm.generate(prompts, sp, use_tqdm=False)
        decode.append((time.perf_counter() - t0, sum(len(c.token_ids) for o in out for c in o.outputs)))
    res = {"startup_s": startup, "before": before, "after": after, "decode": decode}
    print(f"{mode}: start-up {startup:.1f} s; prompt logprobs before {[round(x, 4) for x in before]}, after reload "
          f"{[round(x, 4) for x in after]}; decode " + ", ".join(f"{s:.2f} s ({n / s:.1f} tok/s)" for s, n in decode),
          flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="(one mode) also print the result as JSON")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from actors.rollout.vllm_engine import _size_cpu_threads
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    _size_cpu_threads()
    modes = args.modes.split(",")
    if len(modes) == 2:  # vLLM allows one in-process engine per process at a time: one child per mode
        import json
        import subprocess
        results = {}
        for m in modes:
            out = subprocess.run([sys.executable, __file__, "--modes", m, "--rounds", str(args.rounds), "--json"],
                                 capture_output=True, text=True, check=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
            results[m] = json.loads(line)
            print([x for x in out.stdout.splitlines() if x.startswith(m + ":")][-1], flush=True)
        e, c = results["eager"], results["compiled"]
        changed = all(abs(a - b) > 1.0 for a, b in zip(c["before"], c["after"]))
        agree = max(abs(a - b) for a, b in zip(e["after"], c["after"]))
        speed = (lambda r: sorted(n / s for s, n in r["decode"])[len(r["decode"]) // 2])
        print(f"compiled reload reached the model: {changed}; |compiled - eager| prompt logprobs after reload <= "
              f"{agree:.2e}; decode tokens/s (medians) eager {speed(e):.1f}, compiled {speed(c):.1f}, ratio "
              f"{speed(c) / speed(e):.2f}; start-up eager {e['startup_s']:.1f} s, compiled {c['startup_s']:.1f} s")
        return
    res = run_mode(modes[0], args.rounds)
    if args.json:
        import json
        print(json.dumps(res))


if __name__ == "__main__":
    main()
