"""The shape both built-in tool environments share (calculator, python): one tool in the system prompt
(Hermes/Qwen `<tool_call>` format), each turn either calls tools or answers.

A turn with tool calls gets one `tool` message per call (a malformed call is an observation saying so, never a
crash) and reward 0; more than `max_tool_calls` calls over the episode end it with reward 0; a turn without a
tool call is the final answer, scored by `score(answer_text)`, and ends the episode. A subclass gives the tool's
schema, `score` and `call`. Pure Python; no Ray, no vLLM.
"""
from __future__ import annotations

from orchestrator.rollout.env import EnvStep
from orchestrator.rollout.tool_calls import ToolCall, ToolCallParseError, parse_tool_calls, tools_system_prompt


class ToolEnv:
    """Base of a single-tool environment.

    Args:
        tool: the tool's JSON schema (``{"type": "function", "function": {...}}``), listed in the system prompt.
        max_tool_calls: tool calls allowed per episode.
        system_prompt: text before the tool description in the system message.
    Sample keys: "prompt" (str, the question), "answer" (gold answer, str or number).
    Info per step: {"tool_calls": int, "tool_error": str (a malformed or failed call)}.
    """

    env_name = "tool"

    def __init__(self, tool: dict, max_tool_calls: int, system_prompt: str):
        self.tool, self.max_tool_calls, self.system_prompt = tool, max_tool_calls, system_prompt
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
        return [{"role": "system", "content": tools_system_prompt([self.tool], self.system_prompt)},
                {"role": "user", "content": str(sample["prompt"])}]

    def step(self, action: str) -> EnvStep:
        try:
            calls = parse_tool_calls(action)
        except ToolCallParseError as e:
            return EnvStep({"role": "tool", "content": f"error: {e}"}, 0.0, False, {"tool_error": str(e)})
        if not calls:
            return EnvStep([], float(self.score(action)), True, {"tool_calls": self.tool_calls})
        self.tool_calls += len(calls)
        if self.tool_calls > self.max_tool_calls:
            return EnvStep([], 0.0, True, {"tool_calls": self.tool_calls, "tool_error": "too many tool calls"})
        replies, errors = [], []
        for c in calls:
            content, error = self.call(c)
            replies.append({"role": "tool", "content": content})
            if error:
                errors.append(error)
        info = {"tool_calls": self.tool_calls}
        if errors:
            info["tool_error"] = "; ".join(errors)
        return EnvStep(replies, 0.0, False, info)
