"""The TRL half of `benchmarks/vs_trl.py`: N steps of TRL's GRPOTrainer on the prompts our loader chose.

Runs with the benchmark's own venv (benchmarks/.venv-trl, made by vs_trl.py; trl is not a project
dependency), never with the project's .venv:

    benchmarks/.venv-trl/bin/python benchmarks/trl_side.py --model DIR --prompts P.jsonl \
        --grpo-config CFG.json --out RESULT.json

Inputs (written by vs_trl.py): `--prompts`, one JSON object per line: `messages` (the chat turns our
controller renders), `answer` (gold) and `prompt_ids` (our rendered token ids, checked against TRL's
tokenization before training: a mismatch is an error); `--grpo-config`, the `trl.GRPOConfig` keyword
arguments from `benchmarks/trl_config.py`. The reward is our `accuracy` function, loaded from
orchestrator/reward/functions.py by file path (pure Python + math-verify), so both sides score alike.

Output JSON: `generation` ("transformers" or "vllm-colocate"), `trl_version`, and one row per optimizer
step: `step_s` (wall seconds between the ends of consecutive optimizer steps; step 1 from the start of
`train()`), `generate_s` (seconds in GRPOTrainer._generate: tokenize + sample + decode), `score_s`
(seconds in _generate_and_score_completions, generation included), `train_s` (= step_s - score_s:
forward, backward, optimizer), `completion_tokens`, `prompt_tokens` (mask sums of the trained batch) and
`reward_mean` (mean accuracy of the step's completions), `prompts` (the step's distinct prompt texts).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_accuracy():
    """Our `accuracy(completions, answers) -> list[float]`, imported from its file. The packages above it are bare
    namespaces here (their __init__ files, which import Ray, omegaconf and pebble, are not run), so the modules
    functions.py imports (orchestrator.reward.code_tests, .sandbox: the standard library only) load from the repo."""
    for name, folder in (("orchestrator", REPO / "orchestrator"), ("orchestrator.reward", REPO / "orchestrator" / "reward")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    path = REPO / "orchestrator" / "reward" / "functions.py"
    spec = importlib.util.spec_from_file_location("rl_orch_reward_functions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.accuracy


class StepRecorder:
    """Collects the per-step timings and counts; filled by the wrappers and the callback below."""

    def __init__(self):
        self.t_start = None
        self.t_last = None
        self.rows: list[dict] = []
        self.cur = self._empty()

    @staticmethod
    def _empty() -> dict:
        return {"generate_s": 0.0, "score_s": 0.0, "completion_tokens": 0, "prompt_tokens": 0, "rewards": [],
                "prompts": []}

    def end_step(self, step: int) -> None:
        now = time.perf_counter()
        step_s = now - (self.t_last if self.t_last is not None else self.t_start)
        self.t_last = now
        c = self.cur
        rewards = c.pop("rewards")
        self.rows.append({"step": step, "step_s": step_s, **c, "train_s": step_s - c["score_s"],
                          "reward_mean": sum(rewards) / len(rewards) if rewards else float("nan"),
                          "n_completions": len(rewards)})
        self.cur = self._empty()
        r = self.rows[-1]
        print(f"trl_side: step {step}: {r['step_s']:.1f} s (generate {r['generate_s']:.1f} s), "
              f"{r['completion_tokens']} completion tokens, reward {r['reward_mean']:.3f}", flush=True)


def make_reward_fn(accuracy, rec: StepRecorder):
    """A TRL reward function (signature: prompts, completions, **dataset columns) over our `accuracy`."""

    def accuracy_reward(prompts, completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        values = accuracy(texts, [str(a) for a in answer])
        rec.cur["rewards"].extend(values)
        for p in prompts:  # the step's distinct prompts in order (vs_trl.py checks them against ours)
            text = p[-1]["content"] if isinstance(p, list) else p
            if text not in rec.cur["prompts"]:
                rec.cur["prompts"].append(text)
        return values

    accuracy_reward.__name__ = "accuracy"
    return accuracy_reward


def instrument(trainer, rec: StepRecorder) -> None:
    """Wrap the trainer's generation and scoring methods with timers (instance attributes)."""
    gen, score = trainer._generate, trainer._generate_and_score_completions

    def timed_generate(prompts):
        t0 = time.perf_counter()
        out = gen(prompts)
        rec.cur["generate_s"] += time.perf_counter() - t0
        return out

    def timed_score(inputs):
        t0 = time.perf_counter()
        out = score(inputs)
        rec.cur["score_s"] += time.perf_counter() - t0
        rec.cur["completion_tokens"] += int(out["completion_mask"].sum())
        rec.cur["prompt_tokens"] += int(out["prompt_mask"].sum())
        return out

    trainer._generate, trainer._generate_and_score_completions = timed_generate, timed_score


def check_prompt_ids(trainer, rows: list[dict], n: int = 8) -> None:
    """TRL's chat-template tokenization of the first `n` prompts must equal ours; ValueError otherwise."""
    ids, _, _ = trainer._tokenize_prompts([r["messages"] for r in rows[:n]])
    for i, (theirs, row) in enumerate(zip(ids, rows)):
        if list(theirs) != list(row["prompt_ids"]):
            raise ValueError(f"prompt {i} ({row['messages'][-1]['content']!r}): TRL tokenizes it to {list(theirs)}, "
                             f"rl-orchestrator to {row['prompt_ids']}: the two sides would not see the same prompts")


def prepare_vllm(engine_dtype: str, kv_cache_space_gib: int) -> None:
    """vLLM-CPU environment as our engine sets it (actors/rollout/vllm_engine.py), and the engine dtype:
    TRL's colocate mode builds `vllm.LLM` without a dtype, and vLLM's "auto" turns an fp32 checkpoint into
    bf16 (slow on CPUs without AVX512-BF16), so LLM is wrapped to get `engine_dtype` (ours: rollout.dtype)."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core (external_launcher)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    import trl.generation.vllm_generation as vg

    llm_cls = vg.LLM

    def llm_with_dtype(*a, **kw):
        return llm_cls(*a, **{**kw, "dtype": engine_dtype})

    vg.LLM = llm_with_dtype


def run(args) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    kwargs = json.loads(Path(args.grpo_config).read_text())
    rec = StepRecorder()

    class StepClock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            rec.t_start = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            rec.end_step(state.global_step)

    if kwargs.get("use_vllm"):
        prepare_vllm(args.vllm_dtype, args.vllm_kv_cache_gib)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": r["messages"], "answer": r["answer"]} for r in rows])
    trainer = trl.GRPOTrainer(model=model, processing_class=tokenizer, args=trl.GRPOConfig(**kwargs),
                              reward_funcs=[make_reward_fn(load_accuracy(), rec)], train_dataset=dataset,
                              callbacks=[StepClock()])
    check_prompt_ids(trainer, rows)
    instrument(trainer, rec)
    t0 = time.perf_counter()
    trainer.train()
    return {"trl_version": trl.__version__, "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
            "generation": "vllm-colocate" if kwargs.get("use_vllm") else "transformers",
            "train_wall_s": time.perf_counter() - t0, "steps": rec.rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="local HF model folder")
    p.add_argument("--prompts", required=True, help="JSONL of messages/answer/prompt_ids, in training order")
    p.add_argument("--grpo-config", required=True, help="JSON of trl.GRPOConfig keyword arguments")
    p.add_argument("--out", required=True, help="where to write the result JSON")
    p.add_argument("--vllm-dtype", default="float32", help="vLLM engine dtype in vLLM mode (ours: rollout.dtype)")
    p.add_argument("--vllm-kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE (ours: rollout.kv_cache_space_gib)")
    args = p.parse_args(argv)
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"trl_side: {len(result['steps'])} steps, generation={result['generation']}, wrote {args.out}")


if __name__ == "__main__":
    main()
