"""Tool-using calculator environment: the model may call a calculator, then answers; verifiable reward.

Episode: reset(sample) -> [system (text, "tools": [the calculator schema]), user (sample["prompt"])]. Each policy turn is
either one or more tool calls (``env.tool_format``: Hermes ``<tool_call>``, Llama-3 JSON or Mistral
``[TOOL_CALLS]``, orchestrator/envs/tool_formats.py) calling
``calculator(expression)``, answered by ``"tool"`` messages with the result, or a final answer that
ends the episode with reward `accuracy([turn], [sample["answer"]])` (orchestrator/reward/functions.py:
last ``\\boxed{}`` or last number, compared with math-verify). Tool turns have reward 0.

The expression is evaluated by `safe_eval` over Python's `ast` (numbers, + - * / // % **, unary
signs, parentheses), never `eval`.

Try it: ``python -c "from orchestrator.envs.calculator import safe_eval; print(safe_eval('3*(4+5)'))"``
"""
from __future__ import annotations

import ast
import operator

from orchestrator.reward.functions import accuracy
from orchestrator.envs.tool_env import ToolEnv
from orchestrator.envs.tool_calls import ToolCall

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e300
MAX_EXPONENT = 1000


class CalcError(ValueError):
    """The expression is not plain arithmetic, or its value is undefined or too large."""


def safe_eval(expression: str) -> int | float:
    """Value of an arithmetic `expression` (ints stay exact ints), evaluated over `ast` nodes only.

    Allowed: int/float literals, + - * / // % ** and unary + -, parentheses. Limits: at most
    MAX_EXPRESSION_CHARS characters, |exponent| <= MAX_EXPONENT, |every intermediate| <= 1e300.
    Raises CalcError for anything else (names, calls, attributes, division by zero, overflow).
    """
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalcError(f"not an arithmetic expression: {e.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_eval(node.operand))
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalcError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except OverflowError:
            raise CalcError("result too large") from None
    else:
        raise CalcError(f"unsupported element {type(node).__name__!r}: only numbers and + - * / // % ** ( )")
    if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
        raise CalcError("result too large or not real")
    return value


def format_number(value: int | float) -> str:
    """``27`` -> "27", ``2.0`` -> "2", ``1/3`` -> "0.3333333333" (10 significant digits)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.10g}"


class CalculatorEnv(ToolEnv):
    """Calculator tool environment (see the module docstring; the turn logic is ToolEnv's).

    Args:
        max_tool_calls: tool calls allowed per episode; more ends the episode with reward 0.
        system_prompt: the system message's text (the tool's schema rides with it, see tool_env.py).
        tool_format: the call format (env.tool_format; set by the rollout worker from the chat template).
    Sample keys: "prompt" (str, the question), "answer" (gold answer, str or number).
    Info per step: {"tool_calls": int, "tool_error": str (malformed call or bad expression)}.
    """

    env_name = "calculator"

    def __init__(self, max_tool_calls: int = 4, system_prompt: str = "Answer the question. Give the final number.",
                 tool_format: str = "hermes"):
        if max_tool_calls < 0:
            raise ValueError(f"env.kwargs.max_tool_calls={max_tool_calls}: need >= 0")
        super().__init__(CALCULATOR_TOOL, max_tool_calls, system_prompt, tool_format)

    def score(self, action: str) -> float:
        return accuracy([action], [self.answer])[0]

    def call(self, call: ToolCall) -> tuple[str, str]:
        if call.name != "calculator":
            return f"error: unknown tool {call.name!r}; use 'calculator'", f"unknown tool {call.name!r}"
        try:
            return format_number(safe_eval(str(call.arguments.get("expression", "")))), ""
        except CalcError as e:
            return f"error: {e}", str(e)
