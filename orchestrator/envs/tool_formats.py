"""Tool-call formats of the common chat templates: how a model writes a call, how its reply is a message.

``env.tool_format`` picks one (``auto`` = from the chat template, `detect_tool_format`):

- ``hermes`` (Hermes-2-Pro, Qwen2.5, Qwen3, SmolLM2 fallback): ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``
  blocks anywhere in the turn (orchestrator/envs/tool_calls.py); replies render as ``<tool_response>``.
- ``llama3_json`` (Llama-3.1/3.2 JSON tool calling): the whole turn is one JSON object
  ``{"name": .., "parameters": {..}}``, optionally after ``<|python_tag|>``; replies render in the ``ipython`` role.
- ``mistral`` (Mistral-7B-Instruct-v0.3, Mistral-Nemo/Small): ``[TOOL_CALLS] [{"name": .., "arguments": {..},
  "id": ..}]``, or the v11+ form ``[TOOL_CALLS]name[ARGS]{..}``; replies render as ``[TOOL_RESULTS]`` and need a
  ``tool_call_id`` (9 alphanumeric characters): the model's own id when it gave one, else ``call00001``, ...

Every reply is a message ``{"role": "tool", "content": str}`` (plus ``tool_call_id``/``name`` for Mistral); the
chat template renders the role. A malformed call raises `ToolCallParseError` for the environment to turn into an
observation telling the model so. The tool schemas reach the prompt through the template's own ``tools=``
support; `ToolFormat.system_prompt` describes them in the system text for templates without it.

Try it: ``python -c "from orchestrator.envs.tool_formats import get_tool_format as g; print(g('llama3_json').parse('{\\"name\\": \\"f\\", \\"parameters\\": {}}'))"``
"""
from __future__ import annotations

import json
import re

from orchestrator.envs.tool_calls import ToolCall, ToolCallParseError, call_arguments, parse_tool_calls, tools_system_prompt

TOOL_FORMATS = ("auto", "hermes", "llama3_json", "mistral")
_MISTRAL_V11 = re.compile(r"\s*([A-Za-z0-9_.-]+)\[ARGS\]")


def detect_tool_format(chat_template: str | None) -> str:
    """The tool format a chat template speaks: "mistral" ([TOOL_CALLS]), "llama3_json" (ipython / <|python_tag|>),
    else "hermes" (also for templates with no tool support: the tools are then described in the system text)."""
    t = chat_template or ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3_json"
    return "hermes"


def _json_prefix(text: str, i: int, what: str):
    """(value, end) of the JSON value at the start of `text`; ToolCallParseError names call `i`."""
    try:
        return json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as e:
        raise ToolCallParseError(f"tool call {i}: {what} is not valid JSON ({e.msg} at char {e.pos}): {text[:80]!r}") from None


def _named_call(obj, i: int, args_key: str, call_id: str = "") -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ToolCallParseError(f"tool call {i}: need an object with a string 'name', got {json.dumps(obj)[:80]!r}")
    key = args_key if args_key in obj else ("arguments" if "arguments" in obj else args_key)
    return ToolCall(obj["name"], call_arguments(obj.get(key, {}), i, key), str(obj.get("id", call_id) or ""))


class ToolFormat:
    """One tool-call convention. Subclasses set `name` and `markers` (special tokens the environment must see,
    kept when the turn is decoded) and implement `parse`."""

    name = "hermes"
    markers: tuple = ("<tool_call>", "</tool_call>")

    def parse(self, text: str) -> list:
        """The calls in one turn's text, in order ([] = no call: the turn is an answer).
        Raises ToolCallParseError naming the call and the problem."""
        return parse_tool_calls(text)

    def tool_message(self, call: ToolCall, content: str, index: int) -> dict:
        """The reply to `call` (the `index`-th call of the episode, from 1) as a chat message."""
        return {"role": "tool", "content": content}

    def system_prompt(self, tools: list, preamble: str = "") -> str:
        """System text listing `tools` and the call syntax, for templates that ignore ``tools=``."""
        return tools_system_prompt(tools, preamble)


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    markers = ("<|python_tag|>",)

    def parse(self, text: str) -> list:
        body = text.strip()
        tagged = body.startswith("<|python_tag|>")
        body = body[len("<|python_tag|>"):].strip() if tagged else body
        if not body.startswith("{"):
            if tagged:
                raise ToolCallParseError('tool call 0: after <|python_tag|> write {"name": ..., "parameters": {...}}')
            return []
        calls: list = []
        while body:  # one call per turn; several are separated by ";"
            obj, end = _json_prefix(body, len(calls), "the call")
            calls.append(_named_call(obj, len(calls), "parameters"))
            body = body[end:].strip().lstrip(";").strip()
        return calls

    def system_prompt(self, tools: list, preamble: str = "") -> str:
        listed = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
        return (f"{preamble}\n\n" if preamble else "") + (
            "You may call a function. To call one, answer with only a JSON object "
            '{"name": <function-name>, "parameters": <args-json-object>}. Functions:\n' + listed)


class MistralFormat(ToolFormat):
    name = "mistral"
    markers = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")

    def parse(self, text: str) -> list:
        if "[TOOL_CALLS]" not in text:
            return []
        calls: list = []
        for part in text.split("[TOOL_CALLS]")[1:]:
            body = part.strip()
            v11 = _MISTRAL_V11.match(body)
            if v11:  # [TOOL_CALLS]name[ARGS]{...}
                args = _json_prefix(body[v11.end():].lstrip(), len(calls), "the [ARGS]")[0]
                calls.append(ToolCall(v11.group(1), call_arguments(args, len(calls))))
                continue
            items = _json_prefix(body, len(calls), "the [TOOL_CALLS] list")[0]
            for obj in items if isinstance(items, list) else [items]:
                calls.append(_named_call(obj, len(calls), "arguments"))
        return calls

    def tool_message(self, call: ToolCall, content: str, index: int) -> dict:
        call_id = call.id if re.fullmatch(r"[A-Za-z0-9]{9}", call.id or "") else f"call{index:05d}"
        return {"role": "tool", "content": content, "name": call.name, "tool_call_id": call_id}

    def system_prompt(self, tools: list, preamble: str = "") -> str:
        listed = json.dumps(tools)
        return (f"{preamble}\n\n" if preamble else "") + (
            f"Available tools: {listed}\nTo call tools write [TOOL_CALLS] followed by a JSON list "
            '[{"name": <function-name>, "arguments": <args-json-object>}].')


class AutoFormat(ToolFormat):
    """Recognises any of the formats in the turn itself (for an environment used without a chat template);
    replies carry a tool_call_id so that Mistral templates render them too."""

    name = "auto"
    markers = ToolFormat.markers + Llama3JsonFormat.markers + MistralFormat.markers

    def parse(self, text: str) -> list:
        if "[TOOL_CALLS]" in text:
            return MistralFormat().parse(text)
        if "<tool_call>" in text:
            return parse_tool_calls(text)
        return Llama3JsonFormat().parse(text)

    def tool_message(self, call: ToolCall, content: str, index: int) -> dict:
        return MistralFormat().tool_message(call, content, index)


_FORMATS = {"hermes": ToolFormat, "llama3_json": Llama3JsonFormat, "mistral": MistralFormat, "auto": AutoFormat}


def get_tool_format(name: str, chat_template: str | None = None) -> ToolFormat:
    """The `ToolFormat` called `name` (one of TOOL_FORMATS); "auto" with a `chat_template` is resolved by
    `detect_tool_format`. Raises ValueError naming env.tool_format and the allowed values."""
    if name not in _FORMATS:
        raise ValueError(f"env.tool_format={name!r} is not allowed; choose one of {list(TOOL_FORMATS)}")
    if name == "auto" and chat_template:
        name = detect_tool_format(chat_template)
    return _FORMATS[name]()
