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
        self._frame = self._probe_frame()
        self.uses_template = self._frame is not None
        _, head, tail = self._frame or ("", self.fmt.response_open, self.fmt.response_close)
        self._head_ids, self._tail_ids = self._encode(head), self._encode(tail)

    def __reduce__(self):
        """Pickled as what builds it (a process that gets one builds its own): the
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
        The turn's frame (the template's role markers, or the response tags) is the ids
        learned once from a fixed probe, the result's text is encoded with special-token
        parsing off: a result holding `<|im_end|>`, `<|im_start|>assistant` or the probe's
        own marker stays text inside the tool's turn and can never end it, open a turn of
        its own or move where the frame is cut (the python tool's output is the model's to
        choose)."""
        return self._head_ids + self._encode(self._body(result), literal=True) + self._tail_ids

    def _body(self, result: str) -> str:
        """`result` as the template renders it inside the tool's turn (a template may escape
        or trim it): cut from the whole conversation's render at the frame's fixed lengths,
        never by searching the result's text; the result as written where that render does
        not hold the probe's frame around it (or there is no template)."""
        if self._frame is None:
            return result
        _, head, tail = self._frame
        suffix = self._template_suffix(result)
        framed = suffix is not None and suffix.startswith(head) and suffix.endswith(tail)
        if not framed or len(suffix) < len(head) + len(tail):
            return result
        return suffix[len(head) : len(suffix) - len(tail)]

    def _encode(self, piece: str, *, literal: bool = False) -> list[int]:
        if not piece:
            return []
        return self.tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=literal)

    def _render(self, result: str) -> str | None:
        """The chat template's text of a user turn, an assistant turn holding `_MARK`, a tool
        turn holding `result` and the next assistant turn's prompt; None where the template
        is missing or refuses the tool role."""
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
        return text if isinstance(text, str) else None

    def _probe_frame(self) -> tuple[str, str, str] | None:
        """(the render up to the assistant's content, the tool turn's frame before its
        content, the frame after it up to the next assistant generation), learned from a tool
        turn holding `_PROBE`; None where the template has no tool role (it fails, or drops
        the content)."""
        text = self._render(_PROBE)
        if text is None or _MARK not in text:
            return None
        lead = text[: text.index(_MARK) + len(_MARK)]
        rest = text[len(lead) :]
        if rest.count(_PROBE) != 1:
            return None
        head, tail = rest.split(_PROBE)
        return lead, head, tail

    def _template_suffix(self, result: str) -> str | None:
        """What the chat template renders after the assistant's turn when a tool message
        holding `result` follows and the next assistant turn is prompted: the render past the
        probe's `lead`, cut at its length (whatever `result` holds, `_MARK` included); None
        where the template has no tool role or renders the turns before it differently."""
        text = self._render(result) if self._frame is not None else None
        lead = self._frame[0] if self._frame is not None else ""
        return text[len(lead) :] if text is not None and text.startswith(lead) else None


def _rebuild(args, limits) -> Toolbox:
    max_calls, max_total_tokens, timeout_s, fmt = limits
    return Toolbox(
        *args, max_calls=max_calls, max_total_tokens=max_total_tokens, timeout_s=timeout_s, fmt=fmt
    )
