"""Observation token ids from the model's chat template, rendered incrementally (token-in, token-out).

After the policy's turn the trajectory holds ``context_ids`` (prompt + every sampled and observation
id so far). The environment's reply must be appended as the ids the chat template would put there,
without re-tokenising the history (case C07). Two modes (`EnvConfig.render_mode`):

- "strict": render the whole message history + the new messages with the template (string), check
  that it starts with the decoded ``context_ids`` (string prefix) and that its tokenisation starts
  with the tokenisation of that string (token prefix), and append the remaining ids. A template that
  renders past turns differently from how they were generated (Qwen3-style templates strip past
  ``<think>`` reasoning) fails that check: `ChatTemplatePrefixError` names the turn. Nothing is
  dropped silently.
- "incremental": render only the new messages after a fixed dummy history ``[user "U", assistant
  "A"]``: ids = tokens(render(dummy + new)) minus tokens(render(dummy)), plus the assistant turn's
  closing text (``<|im_end|>\\n`` in ChatML) that the sampled ids lack. Past turns are kept exactly
  as sampled; the template's rewriting of history is never applied (used by verl and SkyRL).

End of the assistant turn: when the sampled ids end with an end-of-turn id (EOS / ``<|im_end|>``)
they keep it (it was sampled and is trained); the template supplies only what follows it (``\\n``).
When the turn was cut off (no end id) the template supplies the whole closing text (mask 0).

Try it: see tests/unit/test_multiturn_render.py (SmolLM2 ChatML template and a reasoning-stripping one).
"""
from __future__ import annotations

from orchestrator.rollout.env import Message

_DUMMY_USER = {"role": "user", "content": "U"}
_DUMMY_ASSISTANT = {"role": "assistant", "content": "A"}


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
    Raises:
        ValueError: unknown mode or no chat template.
        ChatTemplatePrefixError: ("incremental") the template does not render an assistant turn as
            generation prompt + content + closing text.
    """

    def __init__(self, tokenizer, mode: str = "strict", end_of_turn_ids: list | None = None):
        if mode not in ("strict", "incremental"):
            raise ValueError(f"env.render_mode={mode!r}: allowed values are ['strict', 'incremental']")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template (tokenizer.chat_template is empty)")
        self.tokenizer, self.mode = tokenizer, mode
        eos = tokenizer.eos_token_id if end_of_turn_ids is None else end_of_turn_ids
        self.end_of_turn_ids = set(eos if isinstance(eos, (list, tuple, set)) else [eos]) - {None}
        self.close_text = self._assistant_close_text() if mode == "incremental" else ""

    def render(self, messages: list, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def start(self, messages: list) -> "ChatSession":
        """A session for one trajectory whose opening messages are `messages`."""
        return ChatSession(self, messages)

    def _assistant_close_text(self) -> str:
        prompt = self.render([_DUMMY_USER], add_generation_prompt=True)
        full = self.render([_DUMMY_USER, _DUMMY_ASSISTANT], add_generation_prompt=False)
        if not full.startswith(prompt + _DUMMY_ASSISTANT["content"]):
            raise ChatTemplatePrefixError(
                "the chat template does not render an assistant turn as <generation prompt> + content + "
                f"<closing text> (generation prompt {prompt[-40:]!r}, rendered turn {full[len(prompt) - 40:]!r}); "
                "incremental rendering cannot find where the turn ends")
        return full[len(prompt) + len(_DUMMY_ASSISTANT["content"]):]

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
                "strip past <think> reasoning) break token-in-token-out; use env.render_mode=incremental "
                "or a template that keeps past turns")
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
        prompt_ids: [P] ids of the opening messages + generation prompt.
        messages: the message history (assistant contents are decoded text, used only for rendering
            checks in strict mode; the trajectory keeps the sampled ids).
    """

    def __init__(self, renderer: ChatRenderer, messages: list):
        self.renderer = renderer
        self.messages: list[Message] = [dict(m) for m in messages]
        self.prompt_ids = renderer.encode(renderer.render(self.messages, add_generation_prompt=True))
        self.turn = 0

    def _strip_end(self, sampled_ids: list) -> tuple[list, bool]:
        ended = bool(sampled_ids) and sampled_ids[-1] in self.renderer.end_of_turn_ids
        return (sampled_ids[:-1] if ended else sampled_ids), ended

    def action_text(self, sampled_ids: list) -> str:
        """The turn as text for the environment (special tokens removed)."""
        return self.renderer.decode(self._strip_end(sampled_ids)[0], skip_special_tokens=True)

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
        content = self.renderer.decode(content_ids)
        self.messages += [{"role": "assistant", "content": content}] + [dict(m) for m in new_messages]
        r = self.renderer
        if r.mode == "strict":
            return r.token_delta(r.decode(context_ids), r.render(self.messages, add_generation_prompt=True), self.turn)
        close = r.close_text
        last_text = r.decode(sampled_ids[-1:]) if ended else ""
        if ended and last_text and close.startswith(last_text):
            close = close[len(last_text):]  # the sampled end-of-turn id is kept; the template adds the rest
        base = [_DUMMY_USER, _DUMMY_ASSISTANT]
        delta = r.token_delta(r.render(base, add_generation_prompt=False),
                              r.render(base + list(new_messages), add_generation_prompt=True), self.turn)
        return (r.encode(close) if close else []) + delta


def check_template_keeps_history(renderer: ChatRenderer) -> None:
    """Probe the template once: does adding a user turn re-render a past reasoning turn differently?

    Renders [user, assistant "<think>..</think>answer"] and the same + a new user turn; raises
    ChatTemplatePrefixError (turn 1) when the first is not a prefix of the second (e.g. Qwen3
    templates strip past reasoning). Call it at start-up in strict mode to fail before any rollout.
    """
    history = [{"role": "user", "content": "Q1"},
               {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nanswer"}]
    renderer.token_delta(renderer.render(history, add_generation_prompt=False),
                         renderer.render(history + [{"role": "user", "content": "Q2"}], add_generation_prompt=True), 1)
