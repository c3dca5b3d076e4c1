"""Tools by name, their schemas, parsing a tool call out of model text and running it.

A tool is a Python function with type hints and a Google-style docstring (`Args:`), as TRL
takes them; its JSON schema comes from `transformers.utils.get_json_schema`. A call in the
model's text is the Hermes / Qwen2.5 format, `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` (the tags are configurable, `ToolFormat`). Whatever goes wrong (bad JSON,
an unknown tool, wrong arguments, an exception, a timeout) becomes text starting with
"error: " that the model reads as the tool's answer: a tool never stops the run.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformers.utils import get_json_schema

from rlvr.rewards.user import load_user_reward
from rlvr.tools.builtin import BUILTIN_TOOLS

MAX_RESULT_CHARS = 2000  # a longer result is cut: it would only eat the token budget


@dataclass(frozen=True)
class ToolFormat:
    """The tags around a call in the model's text, and around a result where the chat
    template has no tool role (`rlvr.tools.session`)."""

    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    response_open: str = "<tool_response>"
    response_close: str = "</tool_response>"


@dataclass(frozen=True)
class Tool:
    """A callable under its name, with the JSON schema the chat template shows."""

    name: str
    fn: Callable = field(compare=False)
    schema: dict = field(compare=False)


def as_tool(fn: Callable | Tool) -> Tool:
    """A function as a `Tool`; its schema needs type hints and a docstring (ValueError
    naming the function and transformers' reason otherwise)."""
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise ValueError(f"tool {fn!r} is a {type(fn).__name__}, not a function")
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        schema = get_json_schema(fn)
    except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ValueError(
            f"tool {name!r}: no JSON schema ({e}); a tool needs type hints on every argument "
            "and a docstring with an Args: section"
        ) from None
    return Tool(name=name, fn=fn, schema=schema)


def resolve_tool(spec: str | Callable | Tool) -> Tool:
    """A tool from a built-in name (`calc`, `python`), "module:function",
    "path/file.py:function", or a function. Raises ValueError with the reason."""
    if not isinstance(spec, str):
        return as_tool(spec)
    if spec in BUILTIN_TOOLS:
        return as_tool(BUILTIN_TOOLS[spec])
    if ":" not in spec:
        raise ValueError(
            f"tool {spec!r}: expected a built-in ({', '.join(BUILTIN_TOOLS)}), "
            "'module:function' or 'path/to/file.py:function'"
        )
    try:
        fn = load_user_reward(spec)
    except ValueError as e:
        raise ValueError(str(e).replace("user reward", "tool", 1)) from None
    return as_tool(fn)


def resolve_tools(specs: Sequence[str | Callable | Tool]) -> list[Tool]:
    """Tools in order; two with one name are refused (a call could not tell them apart)."""
    tools = [resolve_tool(s) for s in specs]
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tools: two tools named {', '.join(map(repr, dup))}")
    return tools


@dataclass(frozen=True)
class ParsedCall:
    """A call read from the model's text: the tool's name and keyword arguments, or the
    error the model is told instead."""

    name: str | None
    arguments: dict
    error: str | None = None


def parse_call(text: str, fmt: ToolFormat | None = None) -> ParsedCall:
    """The last call in `text`, which ends with `fmt.call_close`: the JSON object between
    the last `call_open` and that close tag, `{"name": str, "arguments": object}` (the
    arguments may also be a JSON string holding the object, as some models write them)."""
    fmt = fmt or ToolFormat()
    end = text.rfind(fmt.call_close)
    start = text.rfind(fmt.call_open, 0, end if end >= 0 else len(text))
    if start < 0 or end < 0:
        return ParsedCall(
            None, {}, f"error: a tool call is {fmt.call_open}{{json}}{fmt.call_close}"
        )
    body = text[start + len(fmt.call_open) : end].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return ParsedCall(None, {}, f"error: the tool call is not valid JSON ({e.msg})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ParsedCall(None, {}, 'error: a tool call is {"name": ..., "arguments": {...}}')
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # not JSON: refused below
            args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        return ParsedCall(call["name"], {}, "error: the tool call's arguments are not an object")
    return ParsedCall(call["name"], args)


@dataclass(frozen=True)
class ToolResult:
    """What one call gave the model: `text` (the result, or "error: ..."), whether it was
    an error, the tool's name (None when the call did not parse) and its wall time."""

    text: str
    error: bool
    name: str | None
    seconds: float


class ToolRunner:
    """Runs parsed calls against `tools`, each under a wall-clock limit of `timeout_s`.

    A call runs in a thread the runner waits on at most `timeout_s` for (0: no limit); a
    thread cannot be killed, so a call past the limit is abandoned and answered with an
    error, and until it returns, further calls of that tool are answered with an error at
    once instead of piling up threads (the `python` tool's own sandbox limit kills its
    program, so its thread does return)."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 10.0):
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        self._busy: dict[str, threading.Thread] = {}

    def __call__(self, call: ParsedCall) -> ToolResult:
        t0 = time.perf_counter()
        text, error = self._run(call)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS]
        return ToolResult(text, error, call.name, time.perf_counter() - t0)

    def _run(self, call: ParsedCall) -> tuple[str, bool]:
        if call.error is not None:
            return call.error, True
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: unknown tool {call.name!r}; tools: {', '.join(self.tools)}", True
        busy = self._busy.get(tool.name)
        if busy is not None and busy.is_alive():
            return f"error: {tool.name}'s previous call is still running", True
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = tool.fn(**call.arguments)
            except BaseException as e:  # reported to the model, never raised
                box["error"] = e

        thread = threading.Thread(target=run, name=f"tool {tool.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s or None)
        if thread.is_alive():
            self._busy[tool.name] = thread
            return f"error: {tool.name} did not return within {self.timeout_s:g} s", True
        if "error" in box:
            e = box["error"]
            prefix = (
                ""
                if isinstance(e, (ValueError, TimeoutError, RuntimeError))
                else (f"{type(e).__name__}: ")
            )
            return f"error: {prefix}{e}", True
        value = box["value"]
        return (value if isinstance(value, str) else json.dumps(value, default=str)), False
