"""What the garbage-collector thresholds of orchestrator/runtime/gc_tuning.py save in a fresh actor process: the imports a
trainer and a rollout worker make, then a rollout engine's start, at Python's default thresholds against ours.

Each kind runs in a fresh Python process (as a Ray actor does: nothing imported yet), alternating, `--repeats`
times each. Both import `orchestrator` first (which installs our thresholds); the "python" kind then sets Python's
defaults back, as (701, 10, 10) so that `import actors` keeps them (install() replaces only the exact defaults): the
two differ in the thresholds alone. Printed: the medians of the import seconds
(ray, torch, transformers, vLLM's LLM, the trainer and rollout actor modules), of the engine's construction
(`VLLMEngine` on the default model) and of the whole process, and the ratios ours / python.

    .venv/bin/python benchmarks/gc_thresholds.py                 # about 2 min on 2 cores
    .venv/bin/python benchmarks/gc_thresholds.py --repeats 5

Not a test: it prints, it never fails on speed (docs/benchmarks.md). Run nothing else meanwhile (2 cores).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.engine_start import alternating  # noqa: E402

CHILD = r"""
import gc, json, sys, time
t0 = time.perf_counter()
import orchestrator
if sys.argv[1] == "python":
    gc.set_threshold(701, 10, 10)
import ray, torch, transformers
from vllm import LLM
import actors.trainer.trainer, actors.rollout.worker
from actors.rollout.vllm_engine import VLLMEngine
from orchestrator.config import load_config
t1 = time.perf_counter()
engine = VLLMEngine(sys.argv[2], load_config("configs/grpo_arith_cpu.yaml", []).rollout)
t2 = time.perf_counter()
print("RESULT" + json.dumps({"thresholds": gc.get_threshold(), "import_s": t1 - t0, "engine_s": t2 - t1}), flush=True)
"""
FIELDS = ("import_s", "engine_s", "wall_s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="model path or 'default' (the prepared SmolLM2)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from orchestrator.utils.models import resolve_model_path

    model = str(resolve_model_path(args.model))
    runs = alternating(CHILD, ("python", "ours"), model, args.repeats)
    print(f"fresh actor process, {model}, {args.repeats} each (medians):")
    med = {k: {f: statistics.median(r[f] for r in v) for f in FIELDS} for k, v in runs.items()}
    for kind, m in med.items():
        print(f"  {kind:<6} thresholds {tuple(runs[kind][0]['thresholds'])!s:<16} imports {m['import_s']:5.2f} s   "
              f"engine {m['engine_s']:5.2f} s   process {m['wall_s']:5.2f} s")
    print("  ratio ours / python: " + ", ".join(f"{f[:-2]} {med['ours'][f] / med['python'][f]:.3f}" for f in FIELDS))


if __name__ == "__main__":
    main()
