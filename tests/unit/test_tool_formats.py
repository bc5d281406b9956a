"""Tool-call formats (orchestrator/envs/tool_formats.py): Hermes, Llama-3 JSON, Mistral; auto from the template;
malformed calls become observations; env.tool_format reaches the tool environments."""
import pytest

from orchestrator.rollout.chat_render import ChatRenderer
from orchestrator.envs.env import with_tool_format
from orchestrator.envs.env_config import EnvConfig, validate_env_config
from orchestrator.envs.calculator import CalculatorEnv
from orchestrator.envs.python_tool import PythonToolEnv
from orchestrator.envs.tool_calls import ToolCall, ToolCallParseError
from orchestrator.envs.tool_formats import TOOL_FORMATS, detect_tool_format, get_tool_format
from tests.unit.template_helpers import SPECS, load_template, template_tokenizer


def test_auto_picks_the_format_from_each_real_template():
    expected = {"qwen3": "hermes", "qwen2_5": "hermes", "smollm2": "hermes", "deepseek_r1_distill_qwen": "hermes",
                "llama3_1": "llama3_json", "mistral_v0_3": "mistral"}
    assert {name: detect_tool_format(load_template(name)) for name in SPECS} == expected
    assert get_tool_format("auto", load_template("mistral_v0_3")).name == "mistral"
    assert get_tool_format("auto").name == "auto"  # no template: recognise any format in the turn
    with pytest.raises(ValueError, match=r"env.tool_format='xml' is not allowed; choose one of \['auto'"):
        get_tool_format("xml")


def test_llama3_json_calls():
    fmt = get_tool_format("llama3_json")
    assert fmt.parse("The answer is 27.") == []
    assert fmt.parse(' {"name": "calculator", "parameters": {"expression": "1+1"}} ') == [
        ToolCall("calculator", {"expression": "1+1"})]
    assert fmt.parse('<|python_tag|>{"name": "f", "arguments": "{\\"x\\": 1}"}; {"name": "g", "parameters": {}}') == [
        ToolCall("f", {"x": 1}), ToolCall("g", {})]
    for bad, message in [('{"name": "f", "parameters": ', "not valid JSON"), ('{"parameters": {}}', "string 'name'"),
                         ('{"name": "f", "parameters": [1]}', "'parameters' must be an object"),
                         ("<|python_tag|>print(1)", "after <|python_tag|>")]:
        with pytest.raises(ToolCallParseError, match=message):
            fmt.parse(bad)
    assert fmt.tool_message(ToolCall("f", {}), "2", 1) == {"role": "tool", "content": "2"}


def test_mistral_calls_in_both_forms_and_tool_call_ids():
    fmt = get_tool_format("mistral")
    assert fmt.parse("no call here") == []
    calls = fmt.parse('[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}, "id": "abcDEF123"}, {"name": "b", "arguments": {}}]')
    assert calls == [ToolCall("a", {"x": 1}, "abcDEF123"), ToolCall("b", {})]
    assert fmt.parse('[TOOL_CALLS]calculator[ARGS]{"expression": "2*3"}[TOOL_CALLS]b[ARGS]{}') == [
        ToolCall("calculator", {"expression": "2*3"}), ToolCall("b", {})]
    assert fmt.tool_message(calls[0], "1", 1)["tool_call_id"] == "abcDEF123"
    assert fmt.tool_message(calls[1], "1", 2) == {"role": "tool", "content": "1", "name": "b", "tool_call_id": "call00002"}
    for bad in ["[TOOL_CALLS] [{'name': 'a'}]", '[TOOL_CALLS] [{"arguments": {}}]', "[TOOL_CALLS]a[ARGS]{oops"]:
        with pytest.raises(ToolCallParseError, match="tool call 0"):
            fmt.parse(bad)


@pytest.mark.parametrize("tool_format, call, malformed", [
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
     '<tool_call>{"name": "calculator"'),
    ("llama3_json", '{"name": "calculator", "parameters": {"expression": "6*7"}}', '{"name": calculator}'),
    ("mistral", '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "6*7"}}]', "[TOOL_CALLS] [{]"),
    ("auto", '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "6*7"}}]', '<tool_call>{"x"</tool_call>'),
])
def test_tool_envs_answer_each_format_and_malformed_calls_are_observations(tool_format, call, malformed):
    env = CalculatorEnv(max_tool_calls=3, tool_format=tool_format)
    env.reset({"prompt": "What is 6*7?", "answer": "42"})
    step = env.step(call)
    assert [m["content"] for m in step.observation] == ["42"] and not step.done and step.info == {"tool_calls": 1}
    assert ("tool_call_id" in step.observation[0]) == (tool_format in ("mistral", "auto"))
    bad = env.step(malformed)  # never raises: the model is told what is wrong
    assert not bad.done and bad.reward == 0.0 and bad.observation["content"].startswith("error: tool call 0")
    assert bad.observation["role"] == "tool" and "tool_error" in bad.info
    assert env.step("It is 42.").reward == 1.0
    assert PythonToolEnv(tool_format=tool_format).format.name == tool_format


def test_env_tool_format_config_and_its_way_to_the_env():
    validate_env_config(EnvConfig(tool_format="mistral"))
    with pytest.raises(ValueError, match=r"env.tool_format='json' is not allowed"):
        validate_env_config(EnvConfig(tool_format="json"))
    assert EnvConfig().tool_format == "auto" and set(TOOL_FORMATS) == {"auto", "hermes", "llama3_json", "mistral"}
    assert with_tool_format(CalculatorEnv, {"max_tool_calls": 2}, "mistral") == {"max_tool_calls": 2, "tool_format": "mistral"}
    assert with_tool_format(CalculatorEnv, {"tool_format": "hermes"}, "mistral") == {"tool_format": "hermes"}
    assert with_tool_format(lambda max_turns=1: None, {}, "mistral") == {}


def test_the_environment_sees_the_call_markers_but_not_other_special_tokens():
    for name, text in [("mistral_v0_3", '[TOOL_CALLS] [{"name": "f", "arguments": {}}]'),
                       ("llama3_1", '<|python_tag|>{"name": "f", "parameters": {}}')]:
        tok = template_tokenizer(name)
        session = ChatRenderer(tok, "incremental").start([{"role": "user", "content": "q"}])
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert session.action_text(ids) == text
        assert session.action_text(tok(f"{tok.bos_token}hi", add_special_tokens=False)["input_ids"]) == "hi"


def test_env_kwargs_tool_format_must_not_disagree_with_env_tool_format():
    from orchestrator.config import load_config
    from orchestrator.config.load import ConfigError

    base = ["env.name=python"]
    with pytest.raises(ConfigError, match=r"env.kwargs.tool_format='mistral': set the format with env.tool_format"):
        load_config("configs/grpo_code_cpu.yaml", [*base, "env.kwargs.tool_format=mistral", "env.tool_format=hermes"])
    with pytest.raises(ConfigError, match=r"env.kwargs.tool_format='bogus'"):
        load_config("configs/grpo_code_cpu.yaml", [*base, "env.kwargs.tool_format=bogus"])
    cfg = load_config("configs/grpo_code_cpu.yaml", [*base, "env.kwargs.tool_format=mistral", "env.tool_format=mistral"])
    assert cfg.env.tool_format == "mistral"
