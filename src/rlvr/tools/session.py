"""`Toolbox`: what a rollout engine needs to run tools inside a response.

The engine generates until the model's text ends with the call's close tag, hands the turn's
text to `Toolbox.respond`, and appends the token ids it gets back as context (never trained):
exactly what the chat template puts between the assistant's turn and the next assistant
generation, e.g. for ChatML `<|im_end|>\\n<|im_start|>tool\\n<tool_response>9716
</tool_response><|im_end|>\\n<|im_start|>assistant\\n`. A template without a tool role (one
that fails on it or drops its content) gets the result inside the assistant's own turn
instead: `<tool_response>9716</tool_response>` (`ToolFormat`'s tags).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlvr.tools.calls import Tool, ToolFormat, ToolResult, ToolRunner, parse_call, resolve_tools

_PROBE, _MARK = "\x02probe\x02", "\x02assistant\x02"


@dataclass(frozen=True)
class ToolReply:
    """The ids appended to the row after a call, and what the call did."""

    ids: list[int]
    result: ToolResult


class Toolbox:
    """Tools bound to a tokenizer, with the rollout's limits on their use.

    max_calls: tool calls run per response; a call beyond it is not run (its close tag does
        not stop the row, which decodes on as if it were plain text).
    max_total_tokens: the whole response's budget in tokens, the model's and the tools'
        together (None: the sampling's max_new_tokens, which then caps both).
    """

    def __init__(
        self,
        tools: Sequence,
        tokenizer,
        *,
        max_calls: int = 4,
        max_total_tokens: int | None = None,
        timeout_s: float = 10.0,
        fmt: ToolFormat | None = None,
    ):
        self.tools: list[Tool] = resolve_tools(tools)
        if not self.tools:
            raise ValueError("Toolbox: no tools")
        self.tokenizer, self.fmt = tokenizer, fmt or ToolFormat()
        self.max_calls, self.max_total_tokens = max_calls, max_total_tokens
        self.runner = ToolRunner(self.tools, timeout_s)
        self.close_ids: list[int] = tokenizer.encode(self.fmt.call_close, add_special_tokens=False)
        if not self.close_ids:
            raise ValueError(f"Toolbox: {self.fmt.call_close!r} encodes to no tokens")
        self.uses_template = self._template_suffix(_PROBE) is not None

    def __reduce__(self):
        """Pickled as what builds it (the rollout server's process builds its own): the
        tools, the tokenizer and the limits; a tool's function pickles by reference."""
        args = (self.tools, self.tokenizer)
        limits = (self.max_calls, self.max_total_tokens, self.runner.timeout_s, self.fmt)
        return _rebuild, (args, limits)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    @property
    def schemas(self) -> list[dict]:
        """The tools' JSON schemas, for `apply_chat_template(..., tools=...)`."""
        return [t.schema for t in self.tools]

    def total_tokens(self, max_new_tokens: int) -> int:
        """The response's width: model tokens and tool tokens together."""
        return self.max_total_tokens or max_new_tokens

    def ends_call(self, ids: Sequence[int]) -> bool:
        """True when `ids` (the row's tokens so far) end with the close tag."""
        k = len(self.close_ids)
        return len(ids) >= k and list(ids[-k:]) == self.close_ids

    def respond(self, turn_ids: Sequence[int]) -> ToolReply:
        """Run the call that ends the model's turn `turn_ids` (its tokens since the last
        tool result): the reply's ids and what the call did."""
        text = self.tokenizer.decode(list(turn_ids), skip_special_tokens=False)
        result = self.runner(parse_call(text, self.fmt))
        return ToolReply(self.reply_ids(result.text), result)

    def reply_ids(self, result: str) -> list[int]:
        """The ids of the tool's turn holding `result`, up to the next assistant generation.
        The turn's frame (the template's role markers, or the response tags) is encoded as
        written, the result's text with special-token parsing off: a result holding
        `<|im_end|>` or `<|im_start|>assistant` stays text and can never end the tool's turn
        or open a turn of its own (the python tool's output is the model's to choose)."""
        head, body, tail = self._split(result)
        return self._encode(head) + self._encode(body, literal=True) + self._encode(tail)

    def _split(self, result: str) -> tuple[str, str, str]:
        """(frame before, the result as rendered, frame after) of the tool's turn."""
        suffix = self._template_suffix(result) if self.uses_template else None
        if suffix is not None:
            head, tail = self._template_suffix(_PROBE).split(_PROBE, 1)
            if (
                suffix.startswith(head)
                and suffix.endswith(tail)
                and len(suffix) >= len(head + tail)
            ):
                return head, suffix[len(head) : len(suffix) - len(tail)], tail
        return self.fmt.response_open, result, self.fmt.response_close

    def _encode(self, piece: str, *, literal: bool = False) -> list[int]:
        if not piece:
            return []
        return self.tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=literal)

    def _template_suffix(self, result: str) -> str | None:
        """What the chat template renders after an assistant turn when a tool message holding
        `result` follows and the next assistant turn is prompted; None where it has no tool
        role (it fails, or the result does not appear)."""
        messages = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": _MARK},
            {"role": "tool", "content": result},
        ]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except Exception:  # no template, or one that refuses the tool role
            return None
        if not isinstance(text, str) or _MARK not in text:
            return None
        suffix = text[text.rindex(_MARK) + len(_MARK) :]
        return suffix if result in suffix else None


def _rebuild(args, limits) -> Toolbox:
    max_calls, max_total_tokens, timeout_s, fmt = limits
    return Toolbox(
        *args, max_calls=max_calls, max_total_tokens=max_total_tokens, timeout_s=timeout_s, fmt=fmt
    )
