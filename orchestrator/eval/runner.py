"""One held-out evaluation on the rollout workers, and when the run does one (`eval.*`, docs/eval.md).

    evaluator = Evaluator(cfg, examples, tokenizer)   # before any actor starts: the eval set, rendered
    evaluator.train_items                             # what the training loader may draw (eval.holdout removes)
    evaluator.before_steps(controller, log)           # step 0 (a fresh start): a row {"step": 0, "eval/*", ...}
    row.update(evaluator.after_step(controller, step))  # every eval.every_steps and at the last step

An evaluation sends the eval prompts through a single-turn rollout source over the run's rollout workers (they
hold the current weights, verified at the weight sync that ended the step; a multi-turn run's eval prompts are
answered in one turn too) with their own sampling (`SamplingOverride`: eval.n,
eval.temperature, eval.max_new_tokens), their own seeds (`eval_seed`) and negative group ids (training's are
>= 0), and scores them with the run's reward actor. It touches no training state: not the prompt loader,
not a training seed, not the step's `rollout/*` or `reward/*` metrics; its wall time is `timing/eval_s`,
which the sizer and the role utilisation do not read.
"""
from __future__ import annotations

import time
from typing import Callable

from orchestrator.data.datasets import answer_kind
from orchestrator.data import Example, render_row
from orchestrator.eval.checks import pass_function
from orchestrator.eval.majority import majority_inputs
from orchestrator.eval.metrics import response_stats, summarize
from orchestrator.eval.prompts import eval_split
from orchestrator.rollout.seeds import eval_seed
from orchestrator.rollout.single_turn import SingleTurnSource
from orchestrator.rollout.types import PromptRequest, SamplingOverride, Trajectory


class Evaluator:
    """The run's eval prompts as requests, and the evaluation itself (see the module docstring). Raises
    DatasetError / ValueError naming the eval.* key or the eval prompt when the eval set cannot be made."""

    def __init__(self, cfg, examples: list[Example], tokenizer):
        self.cfg = cfg
        split = eval_split(cfg, examples)
        self.train_items = split.train_items
        self.dropped = split.dropped
        e = cfg.eval
        sampling = SamplingOverride(e.n, float(e.temperature), e.max_new_tokens or cfg.rollout.max_new_tokens)
        self.requests = [PromptRequest(group_id=-(i + 1), answer=ex.answer, prompt=ex.prompt, seed=eval_seed(e.seed, i),
                                       prompt_ids=render_row(tokenizer, cfg.data, ex.prompt,
                                                             f"eval prompt {i} ({ex.prompt[:60]!r})"),
                                       sampling=sampling) for i, ex in enumerate(split.prompts)]

    @property
    def enabled(self) -> bool:
        return self.cfg.eval.every_steps > 0 and bool(self.requests)

    def due(self, step: int) -> bool:
        """Whether the run evaluates after `step` (0 = before the first step): step 0, every eval.every_steps,
        the last step."""
        every, total = self.cfg.eval.every_steps, self.cfg.trainer.total_steps
        return self.enabled and (step == 0 or step % every == 0 or step == total)

    def before_steps(self, run, log: Callable[[dict], None]) -> None:
        """A fresh start (run.start_step 0) with eval on: evaluate the starting weights and `log` the row
        {"step": 0, "eval/*": ..., "timing/eval_s": ...}."""
        if run.start_step == 0 and self.due(0):
            log({"step": 0, **self.evaluate(run)})

    def after_step(self, run, step: int) -> dict:
        """The eval fields of step `step`'s row when an evaluation is due after it, else {}."""
        return self.evaluate(run) if self.due(step) else {}

    def evaluate(self, run) -> dict:
        """Generate and score the eval prompts on `run`'s workers (a GRPOController: its `version`, `job` and
        `actors`); returns `eval/*` metrics and `timing/eval_s`. Raises RuntimeError with no eval prompt,
        WeightMismatchError when a sample's weight version is not run.version."""
        if not self.requests:
            raise RuntimeError("no eval prompts: set eval.data or eval.holdout (docs/eval.md)")
        t0 = time.perf_counter()
        run.job.settle_sync(keep=True)  # an overlapped weight sync verified first; its metrics go to the next row
        scratch: dict = {}  # the source's rollout/* metrics: not the step's
        source = SingleTurnSource(self.cfg, run.actors.rollout, run.job.wait, run.job.recover_rollout)
        source.window = "eval"  # the fault window of its calls (orchestrator/runtime/faults.py)
        trajs = source.generate(self.requests, run.version, scratch)
        result = run.job.score(trajs)
        out = self.metrics(trajs, result.rewards, result.per_function)
        out.update({f"eval/reward_{k[len('reward/'):]}": v for k, v in result.metrics.items() if k.startswith("reward/")})
        out["eval/weight_version"] = run.version
        if scratch.get("rollout/worker_restarts"):
            out["eval/worker_restarts"] = scratch["rollout/worker_restarts"]
        out["timing/eval_s"] = time.perf_counter() - t0
        return out

    def metrics(self, trajs: list[Trajectory], rewards: list[float], per_function: dict) -> dict:
        """pass@k, avg@k, maj@k (orchestrator/eval/metrics.py), response length and truncation of the scored
        eval trajectories; a sample is correct when eval.pass_function's value (`pass_function`) >= eval.pass_threshold."""
        e = self.cfg.eval
        name = pass_function(self.cfg)
        values = rewards if name == "reward" else per_function[name]
        by_prompt: dict[int, list[int]] = {}
        for i, t in enumerate(trajs):
            by_prompt.setdefault(-t.group_id - 1, []).append(i)
        order = sorted(by_prompt)
        correct = [[values[i] >= e.pass_threshold for i in by_prompt[p]] for p in order]
        kind = answer_kind(e.data or self.cfg.data.source)  # maj@k's vote: orchestrator/eval/majority.py
        finals, golds = majority_inputs(kind, [[trajs[i].text for i in by_prompt[p]] for p in order],
                                        [self.requests[p].answer for p in order])
        out = summarize(correct, finals, golds, list(e.k))
        out.update(response_stats([len(t.response_ids) for t in trajs], [t.finish_reason for t in trajs]))
        out["eval/prompts"], out["eval/samples"] = len(order), len(trajs)
        return out
