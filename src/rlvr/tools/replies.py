"""A model's reply as the chat APIs return it: its tool calls parsed out of the sampled ids
with the model's response template (transformers' `tokenizer.parse_response`), in OpenAI's
`tool_calls` form, and where a turn that calls a tool ends.

The template is the tokenizer's own `response_template` (Qwen3's, the built-in model's,
`rlvr.models.RESPONSE_TEMPLATE`, saved with it); a tokenizer without one whose chat template
writes Hermes calls (`<tool_call>`: Qwen2.5, Qwen3 and Hermes checkpoints saved before
transformers had response templates) is read with the built-in model's, which is that
format; any other has none, and a request with tools is refused (`template_for`).

A turn that calls a tool ends where its first call closes (the literal `close` of the
template's `tool_calls` field, as token ids), as rlvr's own tool rollouts do (docs/tools.md):
the tokens the engine sampled after it are dropped, never returned or trained. A model trained
with the call's end of turn as context (the built-in model: its `<|im_end|>` after
`</tool_call>` has probability 0.001) would otherwise write on to its token budget.

A reply that opens a call but does not parse (bad JSON, no close, a call that is not
`{"name": str, "arguments": object}`) is returned as the text it is, no call in it, and
flagged (`Reply.failed`): the agent sees text, and what is trained is the sampled ids.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from rlvr.models import RESPONSE_TEMPLATE

HERMES_OPEN = "<tool_call>"


@dataclass(frozen=True)
class Reply:
    """`message`: role, content (None beside tool calls when the model wrote no text),
    `tool_calls` as OpenAI returns them (id, type, function name and JSON-string arguments),
    and any other field the template parses (`reasoning_content`); `failed`: it opened a
    call that did not parse, so `message` is the whole text."""

    message: dict[str, Any]
    failed: bool = False

    @property
    def calls(self) -> int:
        return len(self.message.get("tool_calls") or ())


def template_for(tokenizer) -> dict | None:
    """The response template a reply of this tokenizer's model is parsed with (module doc)."""
    own = getattr(tokenizer, "response_template", None)
    if own is not None:
        return own
    chat = getattr(tokenizer, "chat_template", None)
    texts = chat.values() if isinstance(chat, dict) else [chat or ""]
    if any(HERMES_OPEN in text for text in texts):
        return RESPONSE_TEMPLATE
    return None


def _literals(field: dict, key: str) -> list[str]:
    value = field.get(key)
    return [value] if isinstance(value, str) else list(value or [])


def call_end(tokenizer, template: dict, ids: list[int]) -> int | None:
    """The length of `ids` up to the close of their first tool call (after its open, where
    the open is a literal), None when no call closes in them (or the template's close is a
    pattern, not a literal: the turn then ends where the model ends it)."""
    field = template.get("fields", {}).get("tool_calls") or {}
    opens = [tokenizer.encode(t, add_special_tokens=False) for t in _literals(field, "open")]
    closes = [tokenizer.encode(t, add_special_tokens=False) for t in _literals(field, "close")]
    start = min((i for tag in opens if tag and (i := _find(ids, tag, 0)) is not None), default=None)
    if start is None and opens:  # no call opened: a close tag alone ends nothing
        return None
    ends = [
        i + len(tag) for tag in closes if tag and (i := _find(ids, tag, start or 0)) is not None
    ]
    return min(ends, default=None)


def _find(ids: list[int], tag: list[int], start: int) -> int | None:
    for i in range(start, len(ids) - len(tag) + 1):
        if ids[i : i + len(tag)] == tag:
            return i
    return None


def parse_reply(
    tokenizer, template: dict, prompt_ids: list[int], ids: list[int], text: str
) -> Reply:
    """`ids` (the sampled completion; `text` its decoded text without the EOS) as a chat
    reply, parsed with `template` after the prompt `prompt_ids` (parse_response's `prefix`:
    transformers 5.25 reads a fast tokenizer's ids as they are, 5.19 decodes them first)."""
    as_text = Reply({"role": "assistant", "content": text}, failed=True)
    try:
        parsed = tokenizer.parse_response(ids, template, prefix=prompt_ids)
        calls = [_openai_call(call) for call in parsed.pop("tool_calls", None) or ()]
    except (ValueError, TypeError, KeyError, AttributeError):  # the parser's, or a bad call
        return as_text
    if not calls:
        if _opens_call(template, text):  # an open tag the parser did not take as a call
            return as_text
        return Reply({**parsed, "role": "assistant", "content": parsed.get("content") or ""})
    message = {**parsed, "role": "assistant", "content": parsed.get("content") or None}
    return Reply({**message, "tool_calls": calls})


def _opens_call(template: dict, text: str) -> bool:
    field = template.get("fields", {}).get("tool_calls") or {}
    if "open_pattern" in field:
        return re.search(field["open_pattern"], text) is not None
    return any(tag in text for tag in _literals(field, "open"))


def _openai_call(call: Any) -> dict[str, Any]:
    """A parsed call ({"type": "function", "function": {"name", "arguments"}}) as OpenAI
    returns it; ValueError when it is not a name and an object of arguments."""
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool call without a name: {call!r:.200}")
    args = fn.get("arguments", {})
    if isinstance(args, str):  # a JSON string holding the object, as OpenAI sends them
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError(f"tool call {name!r}: arguments {args!r:.200} are not an object")
    function = {"name": name, "arguments": json.dumps(args)}
    return {"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": function}
