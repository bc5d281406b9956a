"""Held-out evaluation: the eval prompt set (prompts.py, pure), its metrics (metrics.py, pure: pass@k, avg@k,
maj@k, ...), the checks of the `eval` config section (checks.py) and the run of one evaluation on the rollout
workers (runner.py). docs/eval.md."""
