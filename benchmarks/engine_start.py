"""How long a rollout engine takes to start: our `VLLMEngine` against a bare `vllm.LLM` with the same arguments.

Each start runs in a fresh Python process (as a Ray actor's does: nothing imported yet), alternating the two kinds,
`--repeats` times each. Printed per kind: the median seconds of the whole process (imports included) and of the
engine's construction alone, then the ratio ours / bare. Our engine adds `gc.freeze()` before vLLM builds
(actors/rollout/vllm_engine.py `_freeze_import_heap`); both get `engine_kwargs` (enforce_eager's eager stance on
CPU included), so the ratio measures what the freeze saves.

    .venv/bin/python benchmarks/engine_start.py                  # the default model (SmolLM2-135M-Instruct)
    .venv/bin/python benchmarks/engine_start.py --model /path --repeats 5

Not a test: it prints, it never fails on speed (docs/benchmarks.md). Run nothing else meanwhile (2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from orchestrator.config import load_config
from actors.rollout.vllm_engine import VLLMEngine, engine_kwargs
cfg = load_config("configs/grpo_arith_cpu.yaml", []).rollout
kind, model = sys.argv[1], sys.argv[2]
t1 = time.perf_counter()
if kind == "ours":
    engine = VLLMEngine(model, cfg)
else:
    from vllm import LLM
    engine = LLM(**engine_kwargs(model, cfg))
t2 = time.perf_counter()
print("RESULT" + json.dumps({"engine_s": t2 - t1, "process_s": t2 - t0}), flush=True)
"""


def run_child(child: str, kind: str, model: str) -> dict:
    """Python code `child` run as `python -c child kind model` in a fresh process (PYTHONPATH = the repo): the JSON
    object of its line starting with RESULT, with "wall_s" added (the whole process). Raises RuntimeError with the
    child's output when it printed no result. Shared with benchmarks/gc_thresholds.py."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", child, kind, model], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "ERROR"}, timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"{kind} child printed no result (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return {**json.loads(line[len("RESULT"):]), "wall_s": time.perf_counter() - t0}


def alternating(child: str, kinds: tuple[str, ...], model: str, repeats: int) -> dict[str, list[dict]]:
    """{kind: [`run_child` result per repeat]}, the kinds alternating (a drift of the machine affects all alike)."""
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind in kinds:
            runs[kind].append(run_child(child, kind, model))
    return runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="model path or 'default' (the prepared SmolLM2)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from orchestrator.utils.models import resolve_model_path

    model = str(resolve_model_path(args.model))
    runs = alternating(CHILD, ("bare", "ours"), model, args.repeats)
    print(f"engine start, {model}, {args.repeats} fresh processes each (medians):")
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("engine_s", "wall_s")} for k, v in runs.items()}
    for kind, m in med.items():
        print(f"  {kind:<5} engine {m['engine_s']:6.2f} s   process {m['wall_s']:6.2f} s")
    print(f"  ratio ours / bare: engine {med['ours']['engine_s'] / med['bare']['engine_s']:.3f}, "
          f"process {med['ours']['wall_s'] / med['bare']['wall_s']:.3f}")


if __name__ == "__main__":
    main()
