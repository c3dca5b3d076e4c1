"""Tools: the built-ins, resolving names, schemas, parsing calls, errors and timeouts as
text, and the tool turn's ids from the chat template."""

import json
import textwrap
import time

import pytest

from rlvr.models import build_tokenizer
from rlvr.tools import (
    ParsedCall,
    Toolbox,
    ToolFormat,
    ToolRunner,
    as_tool,
    calc,
    parse_call,
    resolve_tool,
    resolve_tools,
)


def test_calc_one_operation():
    assert calc("347*28") == "9716"
    assert calc(" 9716 + 519 ") == "10235"
    assert calc("80-117") == "-37"
    assert calc("-3*-4") == "12"
    for bad in ("1+2+3", "2**10", "__import__('os')", "12/3", "", "1" * 13 + "+1"):
        with pytest.raises(ValueError, match="one operation"):
            calc(bad)


def test_schema_from_hints_and_docstring():
    tool = resolve_tool("calc")
    fn = tool.schema["function"]
    assert fn["name"] == "calc"
    assert fn["parameters"]["required"] == ["expression"]
    assert fn["parameters"]["properties"]["expression"]["type"] == "string"

    def no_doc(x: int) -> int:
        return x

    with pytest.raises(ValueError, match=r"no_doc.*type hints.*docstring"):
        as_tool(no_doc)


def test_resolve_by_name_module_and_file(tmp_path):
    path = tmp_path / "mytools.py"
    path.write_text(
        textwrap.dedent(
            '''
            def echo(text: str) -> str:
                """Echo.

                Args:
                    text: what to echo
                """
                return text
            '''
        )
    )
    tools = resolve_tools(["calc", f"{path}:echo", "python"])
    assert [t.name for t in tools] == ["calc", "echo", "python"]
    with pytest.raises(ValueError, match="two tools named 'calc'"):
        resolve_tools(["calc", "rlvr.tools.builtin:calc"])
    with pytest.raises(ValueError, match=r"tool 'nope'.*built-in"):
        resolve_tool("nope")
    with pytest.raises(ValueError, match=r"^tool .*has no 'missing'"):
        resolve_tool(f"{path}:missing")


def test_parse_hermes_call():
    text = (
        'I will call. <tool_call>{"name": "calc", "arguments": {"expression": "1+2"}}</tool_call>'
    )
    assert parse_call(text) == ParsedCall("calc", {"expression": "1+2"})
    # arguments as a JSON string (some models write them so), the last call wins
    inner = json.dumps(json.dumps({"expression": "3*4"}))
    text = f'<tool_call>{{"name": "x"}}</tool_call> <tool_call>{{"name": "calc", "arguments": {inner}}}</tool_call>'
    assert parse_call(text) == ParsedCall("calc", {"expression": "3*4"})
    assert parse_call("<tool_call>{bad</tool_call>").error.startswith(
        "error: the tool call is not valid JSON"
    )
    assert parse_call("</tool_call>").error.startswith("error: a tool call is")
    assert parse_call('<tool_call>["calc"]</tool_call>').error.startswith("error: a tool call is")
    assert (
        "not an object" in parse_call('<tool_call>{"name": "c", "arguments": 3}</tool_call>').error
    )
    tags = ToolFormat(call_open="[CALL]", call_close="[/CALL]")
    assert parse_call('[CALL]{"name": "f", "arguments": {}}[/CALL]', tags) == ParsedCall("f", {})


def _slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "done"


def _boom(x: int) -> str:
    """Fail.

    Args:
        x: anything
    """
    raise KeyError(x)


def test_errors_and_timeouts_become_text():
    run = ToolRunner(resolve_tools(["calc", _slow, _boom]), timeout_s=0.3)
    got = run(ParsedCall("calc", {"expression": "2+2"}))
    assert (got.text, got.error, got.name) == ("4", False, "calc")
    assert run(ParsedCall("calc", {"expression": "2^2"})).text == (
        "error: calc takes one operation such as 12*34"
    )
    assert run(ParsedCall("calc", {"x": 1})).text.startswith(
        "error: TypeError: calc() got an unexpected"
    )
    assert (
        run(ParsedCall("nope", {})).text == "error: unknown tool 'nope'; tools: calc, _slow, _boom"
    )
    assert run(ParsedCall("_boom", {"x": 7})).text == "error: KeyError: 7"
    t0 = time.perf_counter()
    late = run(ParsedCall("_slow", {"seconds": 2.0}))
    assert time.perf_counter() - t0 < 1.5
    assert (late.text, late.error) == ("error: _slow did not return within 0.3 s", True)
    # while the abandoned call still runs, the tool answers at once with an error
    assert (
        run(ParsedCall("_slow", {"seconds": 0.0})).text
        == "error: _slow's previous call is still running"
    )
    assert run(ParsedCall("_slow", {"seconds": 0.0}, error="error: x")).text == "error: x"


def test_python_tool_runs_in_the_sandbox():
    from rlvr.rewards.sandbox import SandboxUnavailable, available_isolation
    from rlvr.tools import make_python_tool

    isolation = "namespaces" if available_isolation() == "namespaces" else "none"
    py = make_python_tool(isolation=isolation, timeout_s=2.0)
    run = ToolRunner([as_tool(py)], timeout_s=10)
    assert run(ParsedCall("python", {"code": "print(6*7)"})).text == "42\n"
    err = run(ParsedCall("python", {"code": "1/0"}))
    assert (err.text, err.error) == ("error: ZeroDivisionError: division by zero", True)
    late = run(ParsedCall("python", {"code": "while True: pass"}))
    assert late.text == "error: the program ran past 2 s"
    assert SandboxUnavailable  # the "auto" isolation refuses where namespaces fail


def test_tool_turn_is_the_chat_templates_suffix():
    tok = build_tokenizer()
    box = Toolbox(["calc"], tok)
    assert box.uses_template and box.close_ids == tok.encode(
        "</tool_call>", add_special_tokens=False
    )
    want = "<|im_end|>\n<|im_start|>tool\n<tool_response>9716</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(box.reply_ids("9716")) == want
    # the same text the template renders for the whole conversation, after the assistant turn
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "content": "9716"},
    ]
    full = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert full.endswith("A" + want)
    # a template without a tool role: the result in tags inside the assistant's turn
    tok.chat_template = "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}{% endif %}{% endfor %}"
    tags = Toolbox(["calc"], tok)
    assert not tags.uses_template
    assert tok.decode(tags.reply_ids("7")) == "<tool_response>7</tool_response>"
    ids = tok.encode('<tool_call>{"name": "calc", "arguments": {"expression": "3*4"}}</tool_call>')
    assert tags.ends_call(ids) and not tags.ends_call(ids[:-1])
    reply = tags.respond(ids)
    assert tok.decode(reply.ids) == "<tool_response>12</tool_response>" and not reply.result.error


def test_config_keys_and_the_runs_toolbox():
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError
    from rlvr.data.prompts import PromptSource
    from rlvr.tasks import TASKS
    from rlvr.training.setup import Given, build_toolbox

    tok = build_tokenizer()
    for bad, key in [
        ({"max_tool_calls": -1}, "rollout.max_tool_calls"),
        ({"max_total_tokens": 8}, "rollout.max_total_tokens"),
        ({"tool_timeout_s": 0}, "rollout.tool_timeout_s"),
        ({"tool_call_tags": ["<c>"]}, "rollout.tool_call_tags"),
        ({"tools": ["calc"], "min_new_tokens": 2}, "rollout.min_new_tokens"),
    ]:
        with pytest.raises(ConfigError, match=f"^{key}: got"):
            load_config(overrides={"rollout": bad})
    cfg = load_config(overrides={"rollout": {"max_new_tokens": 40, "max_total_tokens": 90}})
    none = PromptSource([], [], TASKS["arithmetic"], "arithmetic")
    assert build_toolbox(cfg, none, tok, Given()) is None  # no tools anywhere: no toolbox
    # the task's own tools when rollout.tools is empty; the config's limits
    box = build_toolbox(cfg, PromptSource([], [], TASKS["calc"], "calc"), tok, Given())
    assert box.names == ["calc"] and box.total_tokens(40) == 90
    # rollout.tools wins; a name given by the Python API maps to its function
    cfg = load_config(overrides={"rollout": {"tools": ["mine", "python"], "max_tool_calls": 2}})
    box = build_toolbox(cfg, none, tok, Given(tools={"mine": _boom}))
    assert box.names == ["_boom", "python"] and box.max_calls == 2
    with pytest.raises(ConfigError, match=r"^rollout\.tools: tool 'nope'"):
        build_toolbox(load_config(overrides={"rollout": {"tools": ["nope"]}}), none, tok, Given())
    tags = load_config(
        overrides={"rollout": {"tools": ["calc"], "tool_call_tags": ["[C]", "[/C]"]}}
    )
    box = build_toolbox(tags, none, tok, Given())
    assert box.fmt.call_open == "[C]" and box.close_ids == tok.encode("[/C]")


def test_prompts_must_leave_room_for_the_total_budget(tmp_path):
    """With tools a response may be max_total_tokens long: a prompt that leaves less room
    than that in the model's context is refused by that key."""
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError
    from rlvr.data.prompts import load_prompts

    tok = build_tokenizer()
    over = {
        "data": {"task": "calc", "train_size": 16},
        "rollout": {"max_new_tokens": 100, "max_total_tokens": 200, "prompts_per_step": 4},
        "train": {"eval_size": 4},
    }
    cfg = load_config(overrides=over)
    n = len(load_prompts(cfg, tok, None).train[0].ids)
    load_prompts(cfg, tok, n + 200 + 20)  # room enough
    with pytest.raises(ConfigError, match=r"^rollout\.max_total_tokens: train prompt 0"):
        load_prompts(cfg, tok, n + 150)
