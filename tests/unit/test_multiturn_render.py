"""Observation ids from the chat template: the default SmolLM2 ChatML template and a template that
strips past reasoning (detected in strict mode, handled by incremental rendering)."""
import copy

import pytest
from transformers import AutoTokenizer

from orchestrator.utils.models import resolve_model_path
from orchestrator.rollout.chat_render import ChatRenderer, ChatTemplatePrefixError, check_template_keeps_history

# ChatML like SmolLM2's, but (as Qwen3 does) assistant turns that are not the last message lose their
# "<think>...</think>" part when re-rendered.
STRIPPING_TEMPLATE = (
    "{%- for message in messages %}{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model_path("default"))


@pytest.fixture(scope="module")
def stripping_tok(tok):
    t = copy.deepcopy(tok)
    t.chat_template = STRIPPING_TEMPLATE
    return t


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def run_two_turns(renderer, tok, first_turn_ids):
    """Prompt, sampled turn 1, observation 1; returns (session, context ids after observation 1)."""
    session = renderer.start([{"role": "user", "content": "Guess my number."}])
    ctx = session.prompt_ids + first_turn_ids
    obs = session.observation_ids(ctx, first_turn_ids, [{"role": "user", "content": "higher"}])
    return session, ctx, obs


@pytest.mark.parametrize("mode", ["strict", "incremental"])
def test_smollm2_observation_ids_match_the_template(tok, mode):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == im_end
    sampled = enc(tok, "I guess 50") + [im_end]
    session, ctx, obs = run_two_turns(ChatRenderer(tok, mode), tok, sampled)
    # the sampled <|im_end|> is kept (trained); the template adds "\n", the user turn, the generation prompt
    assert tok.decode(obs) == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    full = tok.apply_chat_template(
        [{"role": "user", "content": "Guess my number."}, {"role": "assistant", "content": "I guess 50"},
         {"role": "user", "content": "higher"}], tokenize=False, add_generation_prompt=True)
    # with canonical sampled ids, the incremental ids equal the template's tokens of the whole history
    assert ctx + obs == enc(tok, full)
    assert session.action_text(sampled) == "I guess 50"


@pytest.mark.parametrize("mode", ["strict", "incremental"])
def test_cut_off_turn_gets_the_closing_text_and_non_canonical_ids_are_kept(tok, mode):
    # "hello" sampled as single characters: the template would tokenise it differently, but the
    # trajectory keeps the sampled ids (C07 with the real tokenizer); no end-of-turn id was sampled
    sampled = [i for ch in "hello" for i in enc(tok, ch)]
    assert len(sampled) == 5 and enc(tok, "hello") != sampled
    session, ctx, obs = run_two_turns(ChatRenderer(tok, mode), tok, sampled)
    assert ctx[-5:] == sampled
    assert tok.decode(obs) == "<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"


def test_strict_mode_detects_a_template_that_strips_past_reasoning(stripping_tok):
    renderer = ChatRenderer(stripping_tok, "strict")
    with pytest.raises(ChatTemplatePrefixError, match="turn 1"):
        check_template_keeps_history(renderer)
    sampled = enc(stripping_tok, "<think>\nmid is 50\n</think>\n\n50") + [stripping_tok.eos_token_id]
    with pytest.raises(ChatTemplatePrefixError, match=r"turn 1: .*differently.*render_mode=incremental"):
        run_two_turns(renderer, stripping_tok, sampled)


def test_strict_mode_accepts_turns_without_reasoning_under_the_stripping_template(stripping_tok):
    sampled = enc(stripping_tok, "50") + [stripping_tok.eos_token_id]
    _, ctx, obs = run_two_turns(ChatRenderer(stripping_tok, "strict"), stripping_tok, sampled)
    assert stripping_tok.decode(obs) == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"


def test_incremental_mode_keeps_past_reasoning_tokens(tok, stripping_tok):
    sampled = enc(stripping_tok, "<think>\nmid is 50\n</think>\n\n50") + [stripping_tok.eos_token_id]
    session, ctx, obs = run_two_turns(ChatRenderer(stripping_tok, "incremental"), stripping_tok, sampled)
    assert ctx[len(session.prompt_ids):] == sampled  # the reasoning ids stay in the history
    assert stripping_tok.decode(obs) == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    # the default template keeps reasoning, so its probe passes
    check_template_keeps_history(ChatRenderer(tok, "strict"))


def test_renderer_rejects_bad_mode_and_missing_template(tok):
    with pytest.raises(ValueError, match="env.render_mode='fast'"):
        ChatRenderer(tok, "fast")
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ChatRenderer(bare)
