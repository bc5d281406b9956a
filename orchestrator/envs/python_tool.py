"""Python tool environment: the model may run code in the sandbox and read its output, then answers.

Episode: reset(sample) -> [system (the tool's description), user (sample["prompt"])]. Each policy turn is either
one or more tool calls (``env.tool_format``, orchestrator/envs/tool_formats.py) calling ``python(code)``, each
answered by a ``"tool"`` message with what the run printed (stdout, then stderr, the exit status and any limit
hit, cut to `max_output_chars`), or a final answer that ends the episode with reward
``reward_fn([turn], [sample["answer"]])`` (`code_tests` by default: the final code block against the task's
unit tests; any reward function name works, e.g. ``accuracy`` for arithmetic rows). Tool turns have reward 0.

Every call runs in `orchestrator/reward/sandbox.py` under `SandboxLimits` built from the constructor's
limits (env.kwargs): CPU and wall seconds, memory, output, no fork, no socket, a temporary directory.
A malformed call, an unknown tool or code that fails is an observation saying so, never a crash.

    env:
      name: python
      kwargs: {reward_fn: code_tests, max_tool_calls: 3, wall_s: 5}
"""
from __future__ import annotations

from orchestrator.reward.functions import resolve_reward_fn
from orchestrator.reward.sandbox import SandboxLimits, SandboxResult, run_python
from orchestrator.envs.tool_env import ToolEnv
from orchestrator.envs.tool_calls import ToolCall

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code (standard library only, no network, a few seconds) and return what it "
                       "prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def describe_run(result: SandboxResult, max_chars: int) -> str:
    """The observation for one run: stdout, stderr, then ``[exit code N]`` and any limit hit, cut to `max_chars`."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    status = f"[exit code {result.exit_code}"
    if result.limit_hit:
        status += f"; stopped: {result.limit_hit} limit" if result.limit_hit != "refused" else "; refused system call"
    if result.truncated:
        status += "; output truncated"
    parts.append(status + "]")
    text = "\n".join(parts)
    if len(text) <= max_chars:
        return text
    tail = "\n...[cut]\n" + parts[-1]
    return text[: max(max_chars - len(tail), 0)] + tail


class PythonToolEnv(ToolEnv):
    """Sandboxed Python tool environment (see the module docstring; the turn logic is ToolEnv's).

    Args:
        reward_fn: the reward function name scoring the final answer against sample["answer"].
        max_tool_calls: tool calls allowed per episode; more ends the episode with reward 0.
        max_output_chars: characters of each tool reply.
        cpu_s, wall_s, memory_mb: the sandbox limits of each call (see SandboxLimits).
        system_prompt: the system message's text (the tool's schema rides with it, see tool_env.py).
        tool_format: the call format (env.tool_format; set by the rollout worker from the chat template).
    Raises:
        ValueError: an unknown reward function, or a limit out of range.
    """

    env_name = "python tool"

    def __init__(self, reward_fn: str = "code_tests", max_tool_calls: int = 3, max_output_chars: int = 2000,
                 cpu_s: float = 2.0, wall_s: float = 5.0, memory_mb: int = 512,
                 system_prompt: str = "Solve the task. You may run Python code first.", tool_format: str = "hermes"):
        if max_tool_calls < 0:
            raise ValueError(f"env.kwargs.max_tool_calls={max_tool_calls}: need >= 0")
        if max_output_chars < 80:
            raise ValueError(f"env.kwargs.max_output_chars={max_output_chars}: need >= 80")
        self.reward = resolve_reward_fn(reward_fn)
        self.limits = SandboxLimits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb,
                                    output_bytes=max(4 * max_output_chars, 4096))
        super().__init__(PYTHON_TOOL, max_tool_calls, system_prompt, tool_format)
        self.max_output_chars = max_output_chars
        self.min_step_timeout_s = float(wall_s)  # one call's wall limit: env.step_timeout_s must exceed it (load.py)

    def score(self, action: str) -> float:
        return float(self.reward([action], [self.answer])[0])

    def call(self, call: ToolCall) -> tuple[str, str]:
        code = call.arguments.get("code")
        if call.name != "python" or not isinstance(code, str):
            return "error: call the tool 'python' with a string 'code'", f"bad call {call.name!r}"
        return describe_run(run_python(code, self.limits), self.max_output_chars), ""
