"""Tool calls in the Hermes / Qwen convention, as the ChatML-family chat templates write them.

The model calls a tool by emitting, anywhere in its turn::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3*(4+5)"}}
    </tool_call>

(Hermes-2-Pro function calling; the same tags appear in the Qwen2.5 / Qwen3 chat templates, which
render tool results as ``<tool_response>`` blocks.) The environment answers with one message of
role ``"tool"`` per call; the chat template decides how that role is rendered.

Source: NousResearch Hermes-Function-Calling README; Qwen2.5 tokenizer_config.json chat template.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolCallParseError(ValueError):
    """A ``<tool_call>`` block is not JSON of the form {"name": str, "arguments": dict}."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: the tool's `name`, its keyword `arguments` and the call's `id` ("" when the
    format carries none; Mistral's templates need one on the tool reply, see tool_formats.py)."""

    name: str
    arguments: dict
    id: str = ""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """All ``<tool_call>{json}</tool_call>`` blocks of `text`, in order ([] when there are none).

    An unclosed ``<tool_call>`` (the turn was cut off) counts as malformed.
    Raises ToolCallParseError naming the block index and the problem.
    """
    calls = []
    for i, body in enumerate(_TOOL_CALL_RE.findall(text)):
        try:
            obj = json.loads(body.strip())
        except json.JSONDecodeError as e:
            raise ToolCallParseError(f"tool call {i}: not valid JSON ({e.msg} at char {e.pos}): {body.strip()[:80]!r}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ToolCallParseError(f"tool call {i}: need an object with a string 'name', got {body.strip()[:80]!r}")
        calls.append(ToolCall(obj["name"], call_arguments(obj.get("arguments", {}), i, "arguments")))
    if text.count("<tool_call>") > len(calls):
        raise ToolCallParseError(f"tool call {len(calls)}: '<tool_call>' without a closing '</tool_call>'")
    return calls


def call_arguments(arguments, i: int, key: str = "arguments") -> dict:
    """A call's arguments as a dict: a dict as is, a JSON string decoded (some models emit them so).

    Raises ToolCallParseError naming call `i` and `key` when they are neither.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ToolCallParseError(f"tool call {i}: '{key}' is a string that is not JSON") from None
    if not isinstance(arguments, dict):
        raise ToolCallParseError(f"tool call {i}: '{key}' must be an object, got {type(arguments).__name__}")
    return arguments


def tools_system_prompt(tools: list[dict], preamble: str = "") -> str:
    """A Hermes-style system prompt that lists `tools` (JSON function schemas) and the call format.

    For templates without native tool support (SmolLM2's ChatML) the tools go into the system text,
    as the Qwen2.5 template itself does.
    """
    listed = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
    return (f"{preamble}\n\n" if preamble else "") + (
        "You may call functions to help you. Function signatures are within <tools></tools>:\n"
        f"<tools>\n{listed}\n</tools>\n"
        "To call a function, write a JSON object with its name and arguments within <tool_call></tool_call>:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
