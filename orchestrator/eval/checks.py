"""Checks of the `eval` config section that involve several fields (orchestrator/config/load.py calls
`check_eval_config`; ranges of single fields are on the schema). Pure: no Ray. Each error names the key."""
from __future__ import annotations


def pass_function(cfg) -> str:
    """The reward function that marks a correct eval sample: eval.pass_function, with "auto" resolved to
    "accuracy" when it is among reward.functions, else "reward" (the weighted total)."""
    name = cfg.eval.pass_function
    if name == "auto":
        return "accuracy" if any(f.name == "accuracy" for f in cfg.reward.functions) else "reward"
    return name


def check_eval_config(cfg) -> None:
    """Raise ValueError naming the eval.* key for: both eval.data and eval.holdout, eval.every_steps > 0 without
    either, a k that is not a whole number in [1, eval.n], eval.n > 1 with greedy decoding (identical samples),
    (eval in use: eval.every_steps, eval.data or eval.holdout set) an eval.pass_function not among
    reward.functions, or eval.max_new_tokens
    + data.max_prompt_tokens over rollout.max_model_len."""
    e = cfg.eval
    if e.data and e.holdout > 0:
        raise ValueError(f"eval.data={e.data!r} and eval.holdout={e.holdout} are both set: the eval prompts come from "
                         "one of them; set eval.data=null or eval.holdout=0")
    if 1 < e.holdout and e.holdout != int(e.holdout):
        raise ValueError(f"eval.holdout={e.holdout} is neither a fraction in (0, 1) of data.source's prompts nor a whole "
                         "count of them (>= 1)")
    if e.every_steps > 0 and not e.data and e.holdout <= 0:
        raise ValueError(f"eval.every_steps={e.every_steps} needs eval prompts: set eval.data (arith or a .jsonl / "
                         ".parquet file) or eval.holdout (a fraction or count of data.source's prompts)")
    if not list(e.k):
        raise ValueError("eval.k is empty; give at least one k, e.g. [1]")
    for i, k in enumerate(e.k):
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= e.n:
            raise ValueError(f"eval.k[{i}]={k!r} must be a whole number in [1, eval.n={e.n}] (pass@k draws k of the "
                             "n samples per prompt)")
    if e.temperature == 0 and e.n > 1:
        raise ValueError(f"eval.n={e.n} with eval.temperature=0 (greedy) samples {e.n} identical responses; set "
                         "eval.n=1, or eval.temperature > 0 for pass@k")
    used = e.every_steps > 0 or bool(e.data) or e.holdout > 0
    names = [f.name for f in cfg.reward.functions] + (["reward_model"] if cfg.reward.model_path else [])
    if used and e.pass_function not in ("reward", "auto") and e.pass_function not in names:
        raise ValueError(f"eval.pass_function={e.pass_function!r} is not a reward function of this run; choose one "
                         f"of {names}, 'reward' (the weighted total) or 'auto'")
    new_tokens = e.max_new_tokens or cfg.rollout.max_new_tokens
    if cfg.data.max_prompt_tokens + new_tokens > cfg.rollout.max_model_len:
        raise ValueError(f"eval.max_new_tokens ({new_tokens}) + data.max_prompt_tokens ({cfg.data.max_prompt_tokens}) "
                         f"exceed rollout.max_model_len ({cfg.rollout.max_model_len})")
