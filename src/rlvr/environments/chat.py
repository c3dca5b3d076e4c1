"""A chat completions request as the endpoint renders it, with its tools, and the text the
chat template renders for a reply sent back in the next request.

A request's `tools` go to the chat template (`apply_chat_template(..., tools=...)`) and turn on
the parsing of its reply into `tool_calls` (`rlvr.tools.replies`), unless `tool_choice` is
"none". A call cannot be forced on a policy that samples freely: `tool_choice` "required" or a
named function is refused.

Turn k+1 is spliced onto turn k's sampled ids where its rendered text begins with turn k's
prompt and reply (`Recorder.prompt_ids`). A reply with tool calls comes back as an assistant
message with `tool_calls`, which the template renders in its own way (`Turn.echo`: the text it
renders after the prompt, up to the end of turn), whatever the sampled text was.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from rlvr.tools.replies import template_for


class BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's messages (content parts joined), its `tools` (None: none) and the
    response template its reply is parsed with (None: the reply is text, as without tools)."""

    messages: list[dict[str, Any]]
    tools: list | None
    template: dict | None


def chat_prompt(tokenizer, request: dict) -> tuple[str, ChatPrompt]:
    """The request's prompt text, rendered by the chat template, and what it was made of."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "messages: expected a non-empty list of messages")
    messages = [plain(m) for m in messages]
    tools = request.get("tools") or None
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise BadRequest(HTTPStatus.BAD_REQUEST, "tools: expected a list of tool objects")
    choice = request.get("tool_choice", "auto")
    if choice not in ("auto", "none", None):
        raise BadRequest(
            HTTPStatus.BAD_REQUEST,
            f"tool_choice: {choice!r:.80} not supported, expected 'auto' or 'none' (the "
            "policy samples freely: a call cannot be forced)",
        )
    template = None
    if tools is not None and choice != "none":
        template = template_for(tokenizer)
        if template is None:
            raise BadRequest(
                HTTPStatus.BAD_REQUEST,
                "tools: the model's tokenizer has no response_template to parse tool calls "
                "with, and its chat template writes no <tool_call> (docs/environments.md)",
            )
    try:
        text = render(tokenizer, messages, tools, generation=True)
    except Exception as e:  # the template's own error (a role it does not know, ...)
        raise BadRequest(
            HTTPStatus.BAD_REQUEST, f"messages: the chat template refused them: {e}"
        ) from None
    return text, ChatPrompt(messages, tools, template)


def render(tokenizer, messages: list[dict], tools: list | None, *, generation: bool) -> str:
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation, tokenize=False, **extra
    )


def echo(tokenizer, chat: ChatPrompt, prompt_text: str, message: dict, eos_texts) -> str | None:
    """What the template renders for `message` (the reply as returned) after the prompt, up
    to its end-of-turn text; None where the rendering does not extend the prompt."""
    try:
        full = render(tokenizer, [*chat.messages, message], chat.tools, generation=False)
    except Exception:  # a template that cannot render the reply: the next turn will drift
        return None
    if not full.startswith(prompt_text):
        return None
    rest = full[len(prompt_text) :]
    end = max((rest.rfind(t) for t in eos_texts if t), default=-1)
    return rest[:end] if end >= 0 else rest


def plain(message) -> dict[str, Any]:
    """A chat message as the template reads it: content parts joined into one string."""
    if not isinstance(message, dict) or "role" not in message:
        raise BadRequest(
            HTTPStatus.BAD_REQUEST,
            f"messages: expected {{role, content}} objects, got {message!r:.200}",
        )
    content = message.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return {**message, "content": content if content is not None else ""}
