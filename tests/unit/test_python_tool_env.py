"""The built-in `python` tool environment: sandboxed runs as tool observations, the final answer scored."""
from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer

from orchestrator.utils.models import resolve_model_path
from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.rollout.chat_render import ChatRenderer
from orchestrator.envs.env import make_env, resolve_env_factory
from orchestrator.envs.env_runner import EnvRunner
from orchestrator.rollout.router import StickyRouter

TESTS = "assert f(1) == 3\nassert f(2) == 5"
SAMPLE = {"prompt": "Write f(x) = 2x + 1.", "answer": TESTS}


def call(code: str) -> str:
    return '<tool_call>{"name": "python", "arguments": {"code": %s}}</tool_call>' % __import__("json").dumps(code)


def test_tool_call_runs_in_the_sandbox_and_returns_its_output():
    env = make_env("python", {"max_tool_calls": 3, "wall_s": 5.0})
    system, user = env.reset(SAMPLE)
    assert system["tools"][0]["function"]["name"] == "python" and user["content"] == SAMPLE["prompt"]
    obs, reward, done, info = env.step(call("print(2 * 21)"))
    assert obs == [{"role": "tool", "content": "42\n[exit code 0]"}] and reward == 0.0 and not done
    obs, *_ = env.step(call("import os\nos.fork()"))
    assert "PermissionError" in obs[0]["content"] and "refused system call" in obs[0]["content"]
    obs, *_ = env.step(call("while True:\n    pass"))
    assert "limit]" in obs[0]["content"]  # stopped at the cpu (or wall) limit
    obs, reward, done, info = env.step("```python\ndef f(x):\n    return 2 * x + 1\n```")
    assert obs == [] and reward == 1.0 and done and info == {"tool_calls": 3}


def test_malformed_calls_and_limits_are_observations_not_crashes():
    env = make_env("python", {"max_tool_calls": 1, "max_output_chars": 80})
    env.reset(SAMPLE)
    obs, reward, done, info = env.step("<tool_call>{not json}</tool_call>")
    assert obs["content"].startswith("error: tool call 0: not valid JSON") and not done
    obs, *_ = env.step('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>')
    assert obs[0]["content"].startswith("error: call the tool 'python'")
    obs, reward, done, info = env.step(call("print(1)"))
    assert done and reward == 0.0 and info["tool_error"] == "too many tool calls"
    env.reset(SAMPLE)
    obs, *_ = env.step(call("print('x' * 10000)"))
    assert len(obs[0]["content"]) <= 80 and obs[0]["content"].endswith("[exit code 0; output truncated]")
    with pytest.raises(ValueError, match="unknown reward function"):
        make_env("python", {"reward_fn": "no_such_reward"})


class PythonPolicyEngine:
    """Turn 1: run code with the tool; turn 2: answer with a code block using the printed value."""

    def __init__(self, tok):
        self.tok = tok

    async def generate(self, prompt_ids, max_tokens, worker, **kw):
        text = self.tok.decode(prompt_ids)
        result = re.findall(r"<\|im_start\|>tool\n([^<]*)<\|im_end\|>", text)
        reply = (f"```python\ndef f(x):\n    return {result[-1].split()[0]} * x + 1\n```" if result
                 else call("print(1 + 1)"))
        ids = self.tok(reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return ids, [-0.5] * len(ids), "stop"


def test_python_tool_through_the_agent_loop_and_chat_template():
    tok = AutoTokenizer.from_pretrained(resolve_model_path("default"))
    loop = AgentLoop(PythonPolicyEngine(tok), EnvRunner(resolve_env_factory("python")), ChatRenderer(tok, "strict"),
                     StickyRouter(1), AgentLoopConfig(max_turns=3, max_new_tokens=64))
    (t,), _ = loop.run_sync([GroupRequest(0, SAMPLE, n=1)])
    assert t.stop_reason == "done" and t.num_turns == 2 and t.turn_rewards == [0.0, 1.0]
    observation = [tid for tid, mask in zip(t.response_ids, t.loss_mask) if not mask]
    assert tok.decode(observation) == "\n<|im_start|>tool\n2\n[exit code 0]<|im_end|>\n<|im_start|>assistant\n"


def test_config_checks_of_the_python_tool_and_gymnasium_kwargs():
    from orchestrator.config import load_config
    from orchestrator.config.load import ConfigError

    with pytest.raises(ConfigError, match=r"env.step_timeout_s=10 must exceed 30s, what one call of env.name='python'"):
        load_config("configs/grpo_code_cpu.yaml", ["env.name=python", "env.kwargs.wall_s=30", "env.step_timeout_s=10"])
    with pytest.raises(ConfigError, match=r"env.kwargs.max_output_chars=10: need >= 80"):
        load_config("configs/grpo_code_cpu.yaml", ["env.name=python", "env.kwargs.max_output_chars=10"])
    with pytest.raises(ConfigError, match=r"env.kwargs.invalid_reward='nan': must be a finite number"):
        load_config("configs/grpo_frozenlake_cpu.yaml", ["env.kwargs.invalid_reward=nan"])
