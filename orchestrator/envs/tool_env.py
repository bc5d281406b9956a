"""The shape both built-in tool environments share (calculator, python): one tool, each turn either calls
tools or answers.

The tool's schema rides on the system message as ``"tools": [schema]``: the chat renderer
(orchestrator/rollout/chat_render.py) renders it through the template's own ``tools=`` support, or lists it in the
system text for templates without one. Calls are parsed in `tool_format` (``env.tool_format``: hermes
``<tool_call>``, llama3_json, mistral ``[TOOL_CALLS]``, or auto; orchestrator/envs/tool_formats.py), and each
reply is a ``tool`` message in that format's shape (with a ``tool_call_id`` for Mistral).

A turn with tool calls gets one `tool` message per call (a malformed call is an observation saying so, never a
crash) and reward 0; more than `max_tool_calls` calls over the episode end it with reward 0; a turn without a
tool call is the final answer, scored by `score(answer_text)`, and ends the episode. A subclass gives the tool's
schema, `score` and `call`. Pure Python; no Ray, no vLLM.
"""
from __future__ import annotations

from orchestrator.envs.env import EnvStep
from orchestrator.envs.tool_calls import ToolCall, ToolCallParseError
from orchestrator.envs.tool_formats import get_tool_format


class ToolEnv:
    """Base of a single-tool environment.

    Args:
        tool: the tool's JSON schema (``{"type": "function", "function": {...}}``), on the system message's "tools".
        max_tool_calls: tool calls allowed per episode.
        system_prompt: the system message's text.
        tool_format: "hermes" (default), "llama3_json", "mistral" or "auto" (any of them, recognised in the
            turn); the rollout worker passes env.tool_format resolved from the chat template.
    Raises ValueError for an unknown tool_format.
    Sample keys: "prompt" (str, the question), "answer" (gold answer, str or number).
    Info per step: {"tool_calls": int, "tool_error": str (a malformed or failed call)}.
    """

    env_name = "tool"

    def __init__(self, tool: dict, max_tool_calls: int, system_prompt: str, tool_format: str = "hermes"):
        self.tool, self.max_tool_calls, self.system_prompt = tool, max_tool_calls, system_prompt
        self.format = get_tool_format(tool_format)
        self.answer, self.tool_calls = "", 0

    def score(self, action: str) -> float:
        """The final answer's reward against ``self.answer``."""
        raise NotImplementedError

    def call(self, call: ToolCall) -> tuple[str, str]:
        """One tool call -> (the tool message's content, an error for ``info["tool_error"]`` or "")."""
        raise NotImplementedError

    def reset(self, sample: dict) -> list[dict]:
        if "prompt" not in sample or "answer" not in sample:
            raise KeyError(f"{self.env_name} sample needs 'prompt' and 'answer', got keys {sorted(sample)}")
        self.answer, self.tool_calls = str(sample["answer"]), 0
        return [{"role": "system", "content": self.system_prompt, "tools": [self.tool]},
                {"role": "user", "content": str(sample["prompt"])}]

    def step(self, action: str) -> EnvStep:
        try:
            calls = self.format.parse(action)
        except ToolCallParseError as e:
            reply = self.format.tool_message(ToolCall("", {}), f"error: {e}", self.tool_calls + 1)
            return EnvStep(reply, 0.0, False, {"tool_error": str(e)})
        if not calls:
            return EnvStep([], float(self.score(action)), True, {"tool_calls": self.tool_calls})
        self.tool_calls += len(calls)
        if self.tool_calls > self.max_tool_calls:
            return EnvStep([], 0.0, True, {"tool_calls": self.tool_calls, "tool_error": "too many tool calls"})
        replies, errors = [], []
        for i, c in enumerate(calls):
            content, error = self.call(c)
            replies.append(self.format.tool_message(c, content, self.tool_calls - len(calls) + i + 1))
            if error:
                errors.append(error)
        info = {"tool_calls": self.tool_calls}
        if errors:
            info["tool_error"] = "; ".join(errors)
        return EnvStep(replies, 0.0, False, info)
