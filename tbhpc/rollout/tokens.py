"""Token-exact episode traces: the ids the policy generated, kept as generated, plus the ids of
every observation in between, appended as deltas with loss mask 0.

Why never re-tokenise: decoding generated ids and encoding the text again does not give the same
ids (a model may emit a non-canonical split, or half a UTF-8 character), and training on
re-tokenised history scores tokens the policy never sampled.

How an observation becomes a delta: render a fixed stand-in conversation that ends with an
assistant turn (BASE), render BASE + the new tool/user messages with the generation prompt, and
keep what the second adds (the chat-template prefix property makes that well defined). The
tokens the template puts after an assistant's end-of-turn (e.g. a newline) are the "glue".
`verify` checks the whole trace against a fresh rendering of the episode and raises
`TemplatePrefixError` when a template breaks the prefix property, instead of training on a
history the model never sees at inference.

Templates that rewrite earlier turns (Qwen3's drops the reasoning of assistant turns before the
last user message) are handled by splitting (`on_break="split"`, the default): at each prompt
the template's own rendering of the history is compared with the stream so far; where they
differ, the stream is closed as one training sample and a new one starts from the template's
rendering (loss mask 0: those tokens are prompt now). Every sample is then exactly what the model
was given and generated, and the model is trained on what a chat endpoint would show it.
The samples of an episode share its reward and advantage. `on_break="error"` raises instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tbhpc.errors import TbhpcError

BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]


class TemplatePrefixError(TbhpcError):
    """The chat template does not render an episode as a prefix-stable token stream."""


def template_messages(messages: list[dict]) -> list[dict]:
    from tbhpc.policy.hf import template_messages as tm
    return tm(messages)


def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class TokenTrace:
    tokenizer: Any
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_versions: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)        # per token: the weights that sampled it ("" if not generated)
    reissued: int = 0                                        # turns issued again (a sync aborted them, unverified weights)
    reprefilled: int = 0                                     # tokens the server prefilled again because weights changed
    raw_turns: list[str] = field(default_factory=list)      # each generation decoded, end-of-turn token excluded
    n_messages: int = 0                                      # messages seen at the last prompt
    tools: list[dict] | None = None                          # tool schemas the first prompt was rendered with
    generated: int = 0
    on_break: str = "split"                                  # split | error (a template that rewrites earlier turns)
    segments: list = field(default_factory=list)             # closed samples: (tokens, loss_mask, logprobs, versions)

    def __post_init__(self) -> None:
        tok = self.tokenizer
        self.eos = tok.eos_token_id
        self.base_ids = self._render(BASE, None, add_generation_prompt=False)
        if self.eos not in self.base_ids:
            raise TemplatePrefixError(f"chat template never emits the end-of-turn token {tok.eos_token!r} after an assistant turn")
        last = len(self.base_ids) - 1 - self.base_ids[::-1].index(self.eos)
        self.glue = self.base_ids[last + 1:]

    def _render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(template_messages(messages), tools=tools or None,
                                                 add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def _append(self, ids: list[int], mask: int, logprobs: list[float] | None = None,
                versions: list[str] | None = None) -> None:
        self.tokens += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.versions += versions if versions is not None else [""] * len(ids)

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The ids to generate from, given the whole message history so far."""
        if not self.tokens:
            self.tools = tools or None
            self._append(self._render(messages, tools, add_generation_prompt=True), 0)
        else:
            if self.n_messages >= len(messages) or messages[self.n_messages]["role"] != "assistant":
                raise TemplatePrefixError("token trace: history must grow by the assistant turn, then observations")
            new = messages[self.n_messages + 1:]
            full = self._render(BASE + new, None, add_generation_prompt=True)
            if full[:len(self.base_ids)] != self.base_ids:
                raise TemplatePrefixError("chat template renders earlier turns differently once new messages follow "
                                          f"(roles {[m['role'] for m in new]}): not prefix-stable")
            close = [] if self.tokens[-1] == self.eos else [self.eos]   # a turn cut by the token cap gets its end-of-turn
            delta = close + self.glue + full[len(self.base_ids):]
            if self.on_break == "split" and not self._renders_as(messages, self.tokens + delta):
                self._split(messages)
            else:
                self._append(delta, 0)
        self.n_messages = len(messages)
        return list(self.tokens)

    def samples(self) -> list[tuple[list[int], list[int], list[float], list[str]]]:
        """The training samples of the episode, (tokens, loss mask, logprobs, per-token version): one
        unless the template rewrote earlier turns."""
        return self.segments + [(self.tokens, self.loss_mask, self.logprobs, self.versions)]

    def _raw_history(self, messages: list[dict]) -> list[dict]:
        """`messages` with each assistant turn as generated (raw text, reasoning included)."""
        out, gi = [], 0
        for m in messages:
            if m["role"] == "assistant" and gi < len(self.raw_turns):
                out.append({"role": "assistant", "content": self.raw_turns[gi]})
                gi += 1
            else:
                out.append(m)
        return out

    def _template_text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(template_messages(self._raw_history(messages)), tools=self.tools,
                                                  tokenize=False, add_generation_prompt=add_generation_prompt)

    def _renders_as(self, messages: list[dict], ids: list[int]) -> bool:
        return self.tokenizer.decode(ids, skip_special_tokens=False) == self._template_text(messages, True)

    def _split(self, messages: list[dict]) -> None:
        """Close the current sample; start the next from the template's rendering of the history."""
        self.segments.append((self.tokens, self.loss_mask, self.logprobs, self.versions))
        self.tokens, self.loss_mask, self.logprobs, self.versions = [], [], [], []
        text = self._template_text(messages, True)
        self._append(list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), 0)

    def add_generation(self, token_ids: list[int], logprobs: list[float], version: str, reissued: int = 0,
                       reprefilled: int = 0, token_versions: list[str] | None = None) -> str:
        """Record one generation; returns its raw text (special tokens kept, end-of-turn dropped).
        `version` labels the turn ("mixed:a,b" when a sync changed the weights mid-turn);
        `token_versions`, when given, says which weights sampled each token."""
        per_token = [version] * len(token_ids) if token_versions is None else list(token_versions)
        if len(per_token) != len(token_ids):
            raise ValueError(f"token trace: {len(token_ids)} tokens but {len(per_token)} versions")
        self._append(list(token_ids), 1, list(logprobs), per_token)
        self.generated += len(token_ids)
        self.reissued += reissued
        self.reprefilled += reprefilled
        self.turn_versions.append(version)
        body = token_ids[:-1] if token_ids and token_ids[-1] == self.eos else token_ids
        raw = self.tokenizer.decode(body, skip_special_tokens=False)
        self.raw_turns.append(raw)
        return raw

    def verify(self, messages: list[dict]) -> None:
        """Re-render the episode (assistant turns as generated) and check that the stored tokens
        decode to a prefix of it; raise TemplatePrefixError at the first differing character."""
        n_asst = sum(m["role"] == "assistant" for m in messages[:self.n_messages])
        ends_with_prompt = len(self.raw_turns) == n_asst          # e.g. stopped by the response budget
        upto = self.n_messages if ends_with_prompt else self.n_messages + 1
        text = self._template_text(messages[:upto], ends_with_prompt)   # the last sample starts at the last break
        stored = self.tokenizer.decode(self.tokens, skip_special_tokens=False)
        if not text.startswith(stored):
            i = _first_diff(stored, text)
            raise TemplatePrefixError(f"chat template is not prefix-stable: re-rendering the episode differs from the stored "
                                      f"tokens at character {i}: stored {stored[max(0, i - 30):i + 30]!r}, "
                                      f"template {text[max(0, i - 30):i + 30]!r}")
