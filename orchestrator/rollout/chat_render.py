"""Observation token ids from the model's chat template, rendered incrementally (token-in, token-out).

After the policy's turn the trajectory holds ``context_ids`` (prompt + every sampled and observation
id so far). The environment's reply must be appended as the ids the chat template would put there,
without re-tokenising the history (case C07). Two modes (`EnvConfig.render_mode`):

- "strict": render the whole message history + the new messages with the template (string), check
  that it starts with the decoded ``context_ids`` (string prefix) and that its tokenisation starts
  with the tokenisation of that string (token prefix), and append the remaining ids. A template that
  renders past turns differently from how they were generated (Qwen3 and DeepSeek-R1 templates strip
  past ``<think>`` reasoning) fails that check: `ChatTemplatePrefixError` names the turn and points to
  "incremental". Nothing is dropped silently.
- "incremental": render the new messages after a fixed dummy history ``[user "U", assistant <marker>]``
  (the marker turn is not the last message, so the template renders it as it renders past turns: no
  empty think block, no generation-prompt suffix such as DeepSeek-R1's ``<think>\\n``). The
  observation is everything the template writes after the marker: the assistant turn's closing text
  (``<|im_end|>\\n`` in ChatML, ``<|eot_id|>`` in Llama-3, `` </s>`` in Mistral), the new messages and
  the generation prompt, as ids = tokens(render) minus tokens(render up to the marker). Past turns
  are kept exactly as sampled (reasoning included); the template's rewriting of history is never
  applied (as verl and SkyRL do). Works with every template whose assistant turn contains its content.

End of the assistant turn: when the sampled ids end with an end-of-turn id (EOS / ``<|im_end|>``)
they keep it (it was sampled and is trained); the template supplies only what follows it (``\\n``;
whitespace the template writes before it, as Mistral's `` </s>``, is dropped with it). When the turn
was cut off (no end id) the template supplies the whole closing text (mask 0).

Tools: a message returned by the environment may carry ``"tools": [schema, ...]`` (the built-in tool
environments put it on their system message). The session renders them through the template's own
``tools=`` support when it has one (Qwen, Llama-3.1, Mistral), else lists them in the system text in
the `tool_format`'s convention (orchestrator/envs/tool_formats.py).

Try it: see tests/unit/test_multiturn_render.py and tests/unit/test_chat_templates.py (the real
templates of Qwen3, Qwen2.5, DeepSeek-R1-Distill, Llama-3.1, Mistral v0.3 and SmolLM2).
"""
from __future__ import annotations

from orchestrator.envs.env import Message
from orchestrator.envs.tool_formats import ToolFormat, get_tool_format

_DUMMY_USER = {"role": "user", "content": "U"}
# the dummy assistant turn of incremental rendering: plain letters (no template trims, splits or escapes them)
_MARKER = "ZqxAssistantTurnMarker"
_DUMMY_ASSISTANT = {"role": "assistant", "content": _MARKER}
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


class ChatTemplatePrefixError(RuntimeError):
    """The chat template does not render the history as the tokens were generated (prefix broken)."""


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class ChatRenderer:
    """Renders prompts and observations with `tokenizer`'s chat template (see the module docstring).

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        mode: "strict" or "incremental".
        end_of_turn_ids: ids that end an assistant turn; default: the tokenizer's eos id(s).
        tool_format: env.tool_format ("auto" = from the template): the special tokens of its calls are kept
            in the text the environment sees, and it describes tools to templates without ``tools=`` support.
    Raises:
        ValueError: unknown mode or tool format, or no chat template.
        ChatTemplatePrefixError: ("incremental") the template does not render a past assistant turn's content.
    """

    def __init__(self, tokenizer, mode: str = "strict", end_of_turn_ids: list | None = None, tool_format: str = "auto"):
        if mode not in ("strict", "incremental"):
            raise ValueError(f"env.render_mode={mode!r}: allowed values are ['strict', 'incremental']")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template (tokenizer.chat_template is empty)")
        self.tokenizer, self.mode = tokenizer, mode
        self.tool_format: ToolFormat = get_tool_format(tool_format, tokenizer.chat_template)
        eos = tokenizer.eos_token_id if end_of_turn_ids is None else end_of_turn_ids
        self.end_of_turn_ids = set(eos if isinstance(eos, (list, tuple, set)) else [eos]) - {None}
        self._end_texts = sorted({tokenizer.decode([i], skip_special_tokens=False) for i in self.end_of_turn_ids} - {""})
        special = set(getattr(tokenizer, "all_special_tokens", []) or [])
        self._hidden_tokens = sorted(special - set(self.tool_format.markers), key=len, reverse=True)
        self.template_has_tools = self._template_renders_tools()
        if mode == "incremental":
            self._check_marker()

    def render(self, messages: list, add_generation_prompt: bool, tools: list | None = None) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **kwargs)

    def encode(self, text: str) -> list:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def action_text(self, ids: list) -> str:
        """`ids` as text for the environment: special tokens removed except the tool format's markers
        (Mistral's [TOOL_CALLS], Llama's <|python_tag|>), which the environment needs to see a call."""
        text = self.decode(ids)
        for token in self._hidden_tokens:
            text = text.replace(token, "")
        return text

    def start(self, messages: list) -> "ChatSession":
        """A session for one trajectory whose opening messages are `messages`."""
        return ChatSession(self, messages)

    def _template_renders_tools(self) -> bool:
        try:
            return self.render([_DUMMY_USER], True, [_PROBE_TOOL]) != self.render([_DUMMY_USER], True)
        except Exception:  # a template that fails on tools= has no usable tool support
            return False

    def _check_marker(self) -> None:
        full = self.render([_DUMMY_USER, _DUMMY_ASSISTANT, {"role": "user", "content": "V"}], add_generation_prompt=True)
        if full.count(_MARKER) != 1:
            raise ChatTemplatePrefixError(
                "the chat template does not render a past assistant turn's content as given (rendered "
                f"{full[-120:]!r}); incremental rendering cannot find where the turn ends")

    def incremental_delta(self, new_messages: list, end_text: str, turn: int) -> list:
        """Ids the template writes after a past assistant turn's content: its closing text (after `end_text`,
        the sampled end-of-turn token's text, when the template writes it there), `new_messages` and the
        generation prompt. Raises ChatTemplatePrefixError when a token boundary merges."""
        full = self.render([_DUMMY_USER, _DUMMY_ASSISTANT] + list(new_messages), add_generation_prompt=True)
        cut = full.find(_MARKER) + len(_MARKER)
        # the sampled end id is kept and stands for the template's end token, the same one or another end-of-turn
        # token (Llama-3.1: a turn the model ended with <|eom_id|> where the template closes with <|eot_id|>);
        # whitespace before it was never sampled
        for text in ([end_text] + [t for t in self._end_texts if t != end_text]) if end_text else []:
            at = full.find(text, cut)
            if at >= 0 and not full[cut:at].strip():
                cut = at + len(text)
                break
        return self.token_delta(full[:cut], full, turn)

    def token_delta(self, prefix_text: str, full_text: str, turn: int) -> list:
        """Ids of `full_text` after `prefix_text`: string prefix and token prefix must both hold.

        Raises ChatTemplatePrefixError naming `turn` and the first differing position.
        """
        if not full_text.startswith(prefix_text):
            i = _first_difference(prefix_text, full_text)
            raise ChatTemplatePrefixError(
                f"turn {turn}: the chat template renders the history differently from the tokens generated "
                f"(first difference at character {i}: generated {prefix_text[max(0, i - 30):i + 30]!r}, "
                f"template {full_text[max(0, i - 30):i + 30]!r}). Templates that rewrite past turns (e.g. "
                "Qwen3 or DeepSeek-R1 strip past <think> reasoning) break token-in-token-out under "
                "env.render_mode=strict: set env.render_mode=incremental, which appends only the new messages "
                "and keeps past turns as sampled")
        full_ids, prefix_ids = self.encode(full_text), self.encode(prefix_text)
        if full_ids[:len(prefix_ids)] != prefix_ids:
            raise ChatTemplatePrefixError(
                f"turn {turn}: the template's tokens of the history are not a prefix of its tokens with the "
                f"new messages (the boundary {prefix_text[-20:]!r} | {full_text[len(prefix_text):][:20]!r} "
                "merges into other tokens)")
        return full_ids[len(prefix_ids):]


class ChatSession:
    """The chat state of one trajectory: the prompt ids, then observation ids after each turn.

    Attributes:
        prompt_ids: [P] ids of the opening messages + generation prompt (+ the tools, see the module docstring).
        messages: the message history (assistant contents are decoded text, used only for rendering
            checks in strict mode; the trajectory keeps the sampled ids).
        tools: the tool schemas rendered with ``tools=`` ([] when none or folded into the system text).
    """

    def __init__(self, renderer: ChatRenderer, messages: list):
        self.renderer = renderer
        self.messages: list[Message] = [dict(m) for m in messages]
        tools = [t for m in self.messages for t in (m.pop("tools", None) or [])]
        self.tools = tools if renderer.template_has_tools else []
        if tools and not renderer.template_has_tools:
            self._fold_tools(tools)
        self.prompt_ids = renderer.encode(renderer.render(self.messages, add_generation_prompt=True, tools=self.tools))
        self.turn = 0

    def _fold_tools(self, tools: list) -> None:
        if self.messages and self.messages[0]["role"] == "system":
            self.messages[0]["content"] = self.renderer.tool_format.system_prompt(tools, self.messages[0]["content"])
        else:
            self.messages.insert(0, {"role": "system", "content": self.renderer.tool_format.system_prompt(tools)})

    def _strip_end(self, sampled_ids: list) -> tuple[list, bool]:
        ended = bool(sampled_ids) and sampled_ids[-1] in self.renderer.end_of_turn_ids
        return (sampled_ids[:-1] if ended else sampled_ids), ended

    def action_text(self, sampled_ids: list) -> str:
        """The turn as text for the environment (special tokens removed, tool-call markers kept)."""
        return self.renderer.action_text(self._strip_end(sampled_ids)[0])

    def observation_ids(self, context_ids: list, sampled_ids: list, new_messages: list) -> list:
        """Ids to append after the sampled turn: the turn's closing text, `new_messages`, generation prompt.

        Args:
            context_ids: [P + R] the trajectory so far, ending with `sampled_ids`.
            sampled_ids: [N] this turn's sampled ids.
            new_messages: the environment's reply (normalised messages).
        Returns:
            list[int], the ids that make the next turn's prompt context_ids + these.
        Raises:
            ChatTemplatePrefixError: the template rewrites the history (strict), or a token boundary merges.
        """
        self.turn += 1
        content_ids, ended = self._strip_end(sampled_ids)
        r = self.renderer
        self.messages += [{"role": "assistant", "content": r.decode(content_ids)}] + [dict(m) for m in new_messages]
        if r.mode == "strict":
            full = r.render(self.messages, add_generation_prompt=True, tools=self.tools)
            return r.token_delta(r.decode(context_ids), full, self.turn)
        return r.incremental_delta(new_messages, r.decode(sampled_ids[-1:]) if ended else "", self.turn)


def check_template_keeps_history(renderer: ChatRenderer) -> None:
    """Probe the template once: is a sampled reasoning turn, followed by a new user turn, re-rendered as sampled?

    The sampled text is the generation prompt of [user] + "<think>..</think>answer" + the EOS token; the
    template's render of [user, assistant, user] with generation prompt must start with it. Raises
    ChatTemplatePrefixError (turn 1) when not (Qwen3 and DeepSeek-R1 strip past reasoning, Mistral v0.3 pads the
    turn with spaces), naming env.render_mode=incremental. Call it at start-up in strict mode.
    """
    user, answer = {"role": "user", "content": "Q1"}, "<think>\nreasoning\n</think>\n\nanswer"
    sampled = renderer.render([user], add_generation_prompt=True) + answer + (renderer.tokenizer.eos_token or "")
    renderer.token_delta(sampled, renderer.render([user, {"role": "assistant", "content": answer},
                                                   {"role": "user", "content": "Q2"}], add_generation_prompt=True), 1)


def end_of_turn_ids(tokenizer, model_path=None) -> list:
    """The ids that end an assistant turn as the engine stops on them: the tokenizer's eos and the model folder's
    generation_config.json `eos_token_id` (an id or a list; Llama-3.1 lists <|end_of_text|>, <|eom_id|>,
    <|eot_id|>), which vLLM stops on too. A folder without a generation config gives the tokenizer's eos only."""
    ids = {tokenizer.eos_token_id} - {None}
    if model_path is not None:
        from transformers import GenerationConfig

        try:
            eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        except (OSError, ValueError):
            eos = None
        ids |= set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    return sorted(ids)
