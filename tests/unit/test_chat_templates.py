"""Multi-turn rendering with the REAL chat templates of Qwen3, Qwen2.5, DeepSeek-R1-Distill-Qwen, Llama-3.1,
Mistral-7B-Instruct-v0.3 and SmolLM2 (tests/fixtures/chat_templates/, sources in each file's first line) over a
byte-level tokenizer built here, in both render modes, with a tool observation (in each template's tool-call
format, the schema rendered through the template's own tools=) and a user observation.

Checks: the trained ids are exactly the sampled ids (reasoning included); every observation id is masked and is
the template's rendering of the new message(s) in context (the template's render of the whole history ends with
it); strict mode stops, pointing to incremental, exactly for the templates that rewrite past turns."""
import asyncio

import pytest

from orchestrator.rollout.agent_loop import AgentLoop, AgentLoopConfig, GroupRequest
from orchestrator.rollout.chat_render import ChatRenderer, ChatTemplatePrefixError, check_template_keeps_history
from orchestrator.envs.env_runner import EnvRunner
from orchestrator.envs.calculator import CalculatorEnv
from orchestrator.rollout.router import StickyRouter
from tests.unit.template_helpers import SPECS, template_tokenizer

ARGS = '{"expression": "3*(4+5)"}'
HERMES_CALL = '<tool_call>\n{"name": "calculator", "arguments": %s}\n</tool_call>' % ARGS
CALLS = {  # turn 1 as the model would sample it after the template's generation prompt
    "qwen3": "<think>\nI need 3*(4+5).\n</think>\n\n" + HERMES_CALL,
    "deepseek_r1_distill_qwen": "I need 3*(4+5).\n</think>\n\n" + HERMES_CALL,  # the prompt ends with <think>\n
    "qwen2_5": HERMES_CALL,
    "smollm2": HERMES_CALL,
    "llama3_1": '{"name": "calculator", "parameters": %s}' % ARGS,
    "mistral_v0_3": '[TOOL_CALLS] [{"name": "calculator", "arguments": %s, "id": "a1b2c3d4e"}]' % ARGS,
}
ANSWER = {"qwen3": "<think>\nThe tool says 27.\n</think>\n\nThe answer is 27.",
          "deepseek_r1_distill_qwen": "The tool says 27.\n</think>\n\nThe answer is 27."}
TOOL_REPLY = {"qwen3": "<tool_response>\n27\n</tool_response>", "qwen2_5": "<tool_response>\n27\n</tool_response>",
              "smollm2": "<|im_start|>tool\n27", "deepseek_r1_distill_qwen": "<｜tool▁output▁begin｜>27<｜tool▁output▁end｜>",
              "llama3_1": '<|start_header_id|>ipython<|end_header_id|>\n\n"27"',
              "mistral_v0_3": '[TOOL_RESULTS] {"call_id": "a1b2c3d4e", "content": 27} [/TOOL_RESULTS]'}
# strict mode: the turn whose observation finds the history re-rendered differently (None = never)
STRICT_FAILS = {"qwen3": 2, "deepseek_r1_distill_qwen": 1, "mistral_v0_3": 1,
                "qwen2_5": None, "llama3_1": None, "smollm2": None}


class FollowUpCalculator(CalculatorEnv):
    """The calculator, but its answer turn is followed by a user question (a user observation), then it ends."""

    def step(self, action):
        step = super().step(action)
        if step.done and not getattr(self, "asked", False):
            self.asked = True
            return step._replace(observation=[{"role": "user", "content": "Are you sure?"}], done=False)
        return step


class ScriptedEngine:
    def __init__(self, turns):
        self.turns, self.prompts = turns, []

    async def generate(self, prompt_ids, max_tokens, worker, **_):
        self.prompts.append(list(prompt_ids))
        ids = self.turns[len(self.prompts) - 1]
        await asyncio.sleep(0)
        return ids, [-0.5] * len(ids), "stop"


def run_episode(name, mode):
    tok = template_tokenizer(name)
    renderer = ChatRenderer(tok, mode)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    sampled = [enc(CALLS[name]) + [tok.eos_token_id], enc(ANSWER.get(name, "The answer is 27.")) + [tok.eos_token_id],
               enc("Yes: 27.") + [tok.eos_token_id]]
    engine = ScriptedEngine(sampled)
    runner = EnvRunner(FollowUpCalculator, {"tool_format": renderer.tool_format.name}, num_workers=1, step_timeout_s=10)
    loop = AgentLoop(engine, runner, renderer, StickyRouter([0]), AgentLoopConfig(max_turns=3, max_tokens=4096, max_new_tokens=512))
    trajectories, _ = loop.run_sync([GroupRequest(0, {"prompt": "What is 3 * (4 + 5)?", "answer": "27"}, n=1)])
    return tok, renderer, sampled, engine, trajectories[0]


@pytest.mark.parametrize("mode", ["incremental", "strict"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_real_template_multiturn(name, mode):
    if mode == "strict" and STRICT_FAILS[name]:
        with pytest.raises(ChatTemplatePrefixError, match=rf"turn {STRICT_FAILS[name]}: .*render_mode=incremental"):
            run_episode(name, mode)
        return
    tok, renderer, sampled, engine, t = run_episode(name, mode)
    assert t.stop_reason == "done" and t.num_turns == 3 and t.reward == 2.0  # the calculator's answer, twice
    assert t.turn_infos[0] == {"tool_calls": 1}  # the call was parsed in the template's format
    # the trained ids are exactly the sampled ids, in order; the rest is masked observation ids
    assert t.trained_ids() == [i for turn in sampled for i in turn]
    assert [t.response_ids[a:b] for a, b in t.turn_spans] == sampled
    observations = [t.response_ids[b:a] for (_, b), (a, _) in zip(t.turn_spans, t.turn_spans[1:])]
    assert all(m == 0 for (_, b), (a, _) in zip(t.turn_spans, t.turn_spans[1:]) for m in t.loss_mask[b:a])
    assert sum(t.loss_mask) == sum(map(len, sampled)) and len(t.loss_mask) == len(t.response_ids)
    # the tool schema went through the template's tools= (or the system text for SmolLM2)
    prompt = tok.decode(t.prompt_ids)
    assert '"name": "calculator"' in prompt and (renderer.template_has_tools or "<tools>" in prompt)
    # each observation is the template's rendering of the new message(s) in context: the template's render of
    # the history (assistant turns as sampled text) up to and including them ends with exactly these ids
    history = [dict(m) for m in _opening(renderer, t, tok)]
    replies = [[{"role": "tool", "content": "27"}], [{"role": "user", "content": "Are you sure?"}]]
    if name == "mistral_v0_3":
        replies[0][0].update(name="calculator", tool_call_id="a1b2c3d4e")
    for k, (turn_ids, obs_ids) in enumerate(zip(sampled, observations)):
        history += [{"role": "assistant", "content": tok.decode(turn_ids[:-1])}] + replies[k]
        full = renderer.render(history, add_generation_prompt=True, tools=_tools(renderer))
        text = tok.decode(obs_ids)
        assert full.endswith(text) and tok(text, add_special_tokens=False)["input_ids"] == obs_ids
        assert (TOOL_REPLY[name] if k == 0 else "Are you sure?") in text
        assert engine.prompts[k + 1] == t.prompt_ids + t.response_ids[:t.turn_spans[k + 1][0]]
    if STRICT_FAILS[name] is None:  # templates that keep past turns: the whole trajectory is their tokenisation
        assert t.prompt_ids + t.response_ids[:t.turn_spans[2][0]] == tok(full, add_special_tokens=False)["input_ids"]


def _tools(renderer):
    from orchestrator.envs.calculator import CALCULATOR_TOOL
    return [CALCULATOR_TOOL] if renderer.template_has_tools else None


def _opening(renderer, t, tok):
    session = renderer.start(CalculatorEnv().reset({"prompt": "What is 3 * (4 + 5)?", "answer": "27"}))
    assert session.prompt_ids == t.prompt_ids
    return session.messages


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_start_up_probe_refuses_strict_exactly_for_the_templates_that_rewrite_past_turns(name):
    renderer = ChatRenderer(template_tokenizer(name), "strict")
    if STRICT_FAILS[name] is None:
        check_template_keeps_history(renderer)
        return
    with pytest.raises(ChatTemplatePrefixError, match=r"turn 1: .*Qwen3.*set env.render_mode=incremental"):
        check_template_keeps_history(renderer)


def test_a_llama_turn_ended_with_eom_keeps_it_in_place_of_the_templates_eot(tmp_path):
    # Llama-3.1's generation_config lists <|eom_id|> and <|eot_id|> as ends (vLLM stops on both); a turn the model
    # ended with <|eom_id|> keeps it, and the template's <|eot_id|> closing that turn is not appended after it
    from transformers import GenerationConfig

    from orchestrator.rollout.chat_render import end_of_turn_ids

    tok = template_tokenizer("llama3_1")
    eom, eot = tok.convert_tokens_to_ids("<|eom_id|>"), tok.convert_tokens_to_ids("<|eot_id|>")
    GenerationConfig(eos_token_id=[eom, eot]).save_pretrained(tmp_path)
    assert end_of_turn_ids(tok, tmp_path) == sorted({eom, eot}) and end_of_turn_ids(tok, None) == [eot]
    assert end_of_turn_ids(tok, tmp_path / "no_such_folder") == [eot]
    reply = [{"role": "user", "content": "Go on."}]
    sampled = tok("<|python_tag|>x = 1", add_special_tokens=False)["input_ids"] + [eom]
    for ids, cut_off in ((end_of_turn_ids(tok, tmp_path), False), (None, True)):
        session = ChatRenderer(tok, "incremental", end_of_turn_ids=ids).start([{"role": "user", "content": "Hi"}])
        obs = tok.decode(session.observation_ids(session.prompt_ids + sampled, sampled, reply))
        assert obs.startswith("<|eot_id|>") == cut_off  # eom not an end id: the turn counts as cut off
        assert obs.endswith("<|start_header_id|>user<|end_header_id|>\n\nGo on.<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\n")
