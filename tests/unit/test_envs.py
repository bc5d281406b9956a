"""Environments: safe calculator, tool-call parsing, guessing game, resolution by name, the runner's
timeout/error handling, and the env config validation."""
import asyncio
import random
import threading
import time

import pytest

from orchestrator.envs.env import EnvStep, as_messages, make_env, resolve_env_factory
from orchestrator.envs.env_config import EnvConfig, validate_env_config
from orchestrator.envs.env_runner import EnvFailure, EnvRunner
from orchestrator.envs.calculator import CALCULATOR_TOOL, CalcError, CalculatorEnv, format_number, safe_eval
from orchestrator.envs.guessing import GuessingEnv
from orchestrator.envs.tool_calls import ToolCallParseError, parse_tool_calls


@pytest.mark.parametrize("expr,value", [("3*(4+5)", 27), ("2**10", 1024), ("7/2", 3.5), ("-3 + 1", -2),
                                        ("17 // 5 + 17 % 5", 5), ("1.5*2", 3.0)])
def test_safe_eval_arithmetic(expr, value):
    assert safe_eval(expr) == value


@pytest.mark.parametrize("expr,msg", [("__import__('os').system('true')", "unsupported"), ("a + 1", "unsupported"),
                                      ("2 ** 100000", "exponent"), ("1/0", "division by zero"), ("[1]", "unsupported"),
                                      ("True + 1", "unsupported"), ("9**999 * 9**999", "too large"), ("", "non-empty"),
                                      ("1+" * 150 + "1", "longer than"), ("3 +", "not an arithmetic")])
def test_safe_eval_rejects_everything_else(expr, msg):
    with pytest.raises(CalcError, match=msg):
        safe_eval(expr)


def test_format_number():
    assert [format_number(v) for v in (27, 2.0, 1 / 3, -0.5)] == ["27", "2", "0.3333333333", "-0.5"]


def test_parse_tool_calls():
    text = ('Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}\n</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("calculator", {"expression": "3*(4+5)"}),
                                                      ("calculator", {"expression": "1+1"})]
    assert parse_tool_calls("The answer is 27.") == []
    with pytest.raises(ToolCallParseError, match="tool call 0: not valid JSON"):
        parse_tool_calls("<tool_call>{name: calculator}</tool_call>")
    with pytest.raises(ToolCallParseError, match="without a closing"):
        parse_tool_calls('<tool_call>{"name": "calculator"')
    with pytest.raises(ToolCallParseError, match="'arguments' must be an object"):
        parse_tool_calls('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>')


def test_calculator_episode():
    env = CalculatorEnv(max_tool_calls=2)
    opening = env.reset({"prompt": "What is 3 * (4 + 5)?", "answer": "27"})
    assert [m["role"] for m in opening] == ["system", "user"] and opening[0]["tools"] == [CALCULATOR_TOOL]
    obs, reward, done, info = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>')
    assert obs == [{"role": "tool", "content": "27"}] and (reward, done) == (0.0, False) and info == {"tool_calls": 1}
    assert env.step("The answer is 27.") == EnvStep([], 1.0, True, {"tool_calls": 1})
    env.reset({"prompt": "q", "answer": "27"})
    assert env.step("The answer is 26.").reward == 0.0


def test_calculator_errors_are_observations_not_failures():
    env = CalculatorEnv(max_tool_calls=2)
    env.reset({"prompt": "q", "answer": "1"})
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>')
    assert step.observation == [{"role": "tool", "content": "error: division by zero"}] and not step.done
    step = env.step('<tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert "unknown tool 'search'" in step.info["tool_error"] and not step.done
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>')
    assert step.done and step.reward == 0.0 and step.info["tool_error"] == "too many tool calls"
    with pytest.raises(KeyError, match="'prompt' and 'answer'"):
        env.reset({"question": "q"})


def test_guessing_game():
    env = GuessingEnv(low=1, high=100, max_turns=4)
    env.reset({"secret": 37})
    assert [env.step(a).observation for a in ("50", "I say 25")] == ["lower", "higher"]
    assert env.step("37") == EnvStep("correct", 1.0, True, {"guess": 37, "guesses": 3})
    shaped = GuessingEnv(max_turns=4, turn_penalty=0.25)
    shaped.reset({"secret": 37})
    shaped.step("50"), shaped.step("no idea")
    assert shaped.step("37").reward == 0.5  # 1 - 0.25 * (3 - 1)
    env.reset({"secret": 37})
    steps = [env.step("1") for _ in range(4)]
    assert [s.done for s in steps] == [False, False, False, True] and steps[-1].reward == 0.0
    a = GuessingEnv()
    assert "between 1 and 100" in a.reset({"seed": 5})
    assert a.secret == random.Random(5).randint(1, 100)
    with pytest.raises(ValueError, match="outside"):
        GuessingEnv(high=10).reset({"secret": 11})


def test_resolution_by_name_and_dotted_path():
    assert resolve_env_factory("calculator") is CalculatorEnv
    assert resolve_env_factory("orchestrator.envs.guessing:GuessingEnv") is GuessingEnv
    assert resolve_env_factory("orchestrator.envs.guessing.GuessingEnv") is GuessingEnv
    assert make_env("guessing", {"high": 10}).high == 10
    with pytest.raises(ValueError, match=r"env.name='nope.module:X': cannot import module 'nope.module'"):
        resolve_env_factory("nope.module:X")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        resolve_env_factory("orchestrator.envs.guessing:Missing")
    with pytest.raises(ValueError, match="reset.*step"):
        resolve_env_factory("orchestrator.envs.guessing:random")
    with pytest.raises(ValueError, match="neither a built-in"):
        resolve_env_factory("chess")
    with pytest.raises(ValueError, match="env.kwargs"):
        make_env("guessing", {"colour": "red"})


def test_as_messages():
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    assert as_messages({"role": "tool", "content": "3"}, "user") == [{"role": "tool", "content": "3"}]
    with pytest.raises(ValueError, match="message 0"):
        as_messages([{"role": "user"}])
    with pytest.raises(ValueError, match="non-empty list"):
        as_messages([])


class FlakyEnv:
    """step raises for action "boom", hangs until `release` is set for "hang", returns NaN for "nan"."""

    release = threading.Event()

    def reset(self, sample):
        return "go"

    def step(self, action):
        if action == "boom":
            raise RuntimeError("env crashed")
        if action == "hang":
            FlakyEnv.release.wait(10)
            return EnvStep("late", 0.0, False, {})
        if action == "nan":
            return ("x", float("nan"), False, {})
        return EnvStep("ok", 1.0, False, {})


def test_runner_turns_errors_and_hangs_into_counted_failures():
    runner = EnvRunner(FlakyEnv, num_workers=2, step_timeout_s=0.3)

    async def scenario():
        env = await runner.make()
        assert await runner.reset(env, {}) == [{"role": "user", "content": "go"}]
        outcomes = {}
        for action in ("fine", "boom", "nan", "hang"):
            t0 = time.perf_counter()
            try:
                outcomes[action] = (await runner.step(env, action)).observation
            except EnvFailure as e:
                outcomes[action] = (e.kind, e.where, e.message)
            outcomes[action + "_s"] = time.perf_counter() - t0
        return outcomes

    out = asyncio.run(scenario())
    assert out["fine"] == [{"role": "user", "content": "ok"}]
    assert out["boom"] == ("error", "step", "RuntimeError: env crashed")
    assert out["nan"][0] == "error" and "finite" in out["nan"][2]
    assert out["hang"][0] == "timeout" and "env.step_timeout_s=0.3" in out["hang"][2]
    assert 0.3 <= out["hang_s"] < 2.0  # the loop stopped waiting; the thread is still inside step
    assert (runner.stats.errors, runner.stats.timeouts, runner.stats.stuck_threads) == (2, 1, 1)
    FlakyEnv.release.set()  # the stuck thread returns; its late result is dropped
    for _ in range(100):
        if runner.stats.stuck_threads == 0:
            break
        time.sleep(0.02)
    assert runner.stats.stuck_threads == 0


def test_env_config_validation():
    validate_env_config(EnvConfig(name="guessing"), max_model_len=1024)
    for cfg, key in [(EnvConfig(num_workers=0), "env.num_workers=0"), (EnvConfig(step_timeout_s=0), "env.step_timeout_s"),
                     (EnvConfig(max_turns=0), "env.max_turns"), (EnvConfig(max_tokens=1), "env.max_tokens"),
                     (EnvConfig(render_mode="fast"), "env.render_mode='fast'")]:
        with pytest.raises(ValueError, match=key):
            validate_env_config(cfg)
    with pytest.raises(ValueError, match="rollout.max_model_len=512"):
        validate_env_config(EnvConfig(max_tokens=1024), max_model_len=512)


def test_a_built_in_environment_is_found_under_its_path_before_the_move():
    """Built-ins lived in orchestrator.rollout.envs until 2026-12-06: a run config naming that path still loads."""
    assert resolve_env_factory("orchestrator.rollout.envs.guessing:GuessingEnv") is GuessingEnv
    assert resolve_env_factory("orchestrator.envs.calculator.CalculatorEnv") is CalculatorEnv
