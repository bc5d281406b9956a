"""Environments of multi-turn rollouts, apart from their scheduling (orchestrator/rollout/): the protocol and its
resolution (env.py: `Environment`, `EnvStep`, the built-ins by name), the `env` config section (env_config.py), where
environments run (env_runner.py in-process, env_pool.py in a pool of Ray actors), tool-call formats (tool_calls.py,
tool_formats.py), and the built-in environments with verifiable rewards: `calculator` and `python` (tool use,
tool_env.py, calculator.py, python_tool.py), `guessing` (guessing.py) and Gymnasium text games (gymnasium_text.py)."""
