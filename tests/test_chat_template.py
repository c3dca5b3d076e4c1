"""The built-in model's chat template with tools and tool calls, and its response template.

- Messages without `tools` or `tool_calls` render as plain ChatML, as they always have (every
  task's prompt, with and without a system message): the trained ids do not move.
- A request with the calc tool's schema renders the prompt the `calc` task trains on, id for
  id; the calc conversation as OpenAI messages (assistant `tool_calls`, `tool` messages)
  renders the task's own row.
- The response template is saved with the tokenizer and parses the model's calls, under the
  transformers of this venv (scripts/vllm_env.sh runs this file under the vLLM venv's too).
"""

import json

import pytest
from transformers.utils import get_json_schema

from rlvr.data.prompts import render_messages
from rlvr.models import RESPONSE_TEMPLATE, build_tokenizer, load_tokenizer
from rlvr.tasks import TASKS
from rlvr.tools import calc

CALC = get_json_schema(calc)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _chatml(messages, generation=True):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation else "")


@pytest.mark.parametrize("task", sorted(TASKS))
def test_plain_messages_keep_their_ids(tokenizer, task):
    for ex in TASKS[task].make_examples("train", 8, seed=0):
        for system in ([], [{"role": "system", "content": "Think step by step."}]):
            messages = [*system, *TASKS[task].prompt_messages(ex)]
            text, ids = render_messages(messages, tokenizer)
            assert text == _chatml(messages)
            assert ids == tokenizer(_chatml(messages), add_special_tokens=False)["input_ids"]


def test_the_calc_schema_renders_the_prompt_calc_trains_on(tokenizer):
    task = TASKS["calc"]
    for ex in task.make_examples("test", 8, seed=1234):
        messages = task.prompt_messages(ex)
        with_tools = tokenizer.apply_chat_template(
            messages, tools=[CALC], add_generation_prompt=True, tokenize=False
        )
        # 0 of the prompt's 71 ids differ: the model was trained on this prompt
        assert with_tools == render_messages(messages, tokenizer)[0]
        # a function is taken as its schema
        assert with_tools == tokenizer.apply_chat_template(
            messages, tools=[calc], add_generation_prompt=True, tokenize=False
        )


def _openai_conversation(task, ex, arguments_as_json: bool):
    """The calc task's reference turns as an OpenAI function-calling loop sends them back."""
    out = []
    for k, message in enumerate(task.reference_messages(ex)):
        if message["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": f"call_{k - 1}", **message})
        elif "<tool_call>" in message["content"]:
            call = json.loads(
                message["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")
            )
            args = json.dumps(call["arguments"]) if arguments_as_json else call["arguments"]
            function = {"name": call["name"], "arguments": args}
            tool_call = {"id": f"call_{k}", "type": "function", "function": function}
            out.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
        else:
            out.append(message)
    return out


@pytest.mark.parametrize("arguments_as_json", [True, False])
def test_tool_calls_render_the_calc_row(tokenizer, arguments_as_json):
    task = TASKS["calc"]
    for ex in task.make_examples("test", 4, seed=1234):
        prompt = task.prompt_messages(ex)
        text = tokenizer.apply_chat_template(
            prompt + _openai_conversation(task, ex, arguments_as_json), tools=[CALC], tokenize=False
        )
        row = render_messages(prompt, tokenizer)[0] + task.reference_completion(ex) + "<|im_end|>\n"
        assert text == row


def test_tools_are_listed_in_the_system_message(tokenizer):
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "1*2?"}]
    text = tokenizer.apply_chat_template(
        messages, tools=[CALC], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        f"<|im_start|>system\nBe exact.\n\n<tools>\n{json.dumps(CALC)}\n</tools><|im_end|>\n"
        "<|im_start|>user\n1*2?<|im_end|>\n<|im_start|>assistant\n"
    )
    # without tools, the system message is as it was
    assert tokenizer.apply_chat_template(messages, tokenize=False) == _chatml(messages, False)


def test_the_response_template_is_saved_and_parses_calls(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer_config.json").read_text())["response_template"]
    assert saved == RESPONSE_TEMPLATE
    for loaded in (load_tokenizer(str(tmp_path)), load_tokenizer("rlvr-tiny")):
        assert loaded.response_template == RESPONSE_TEMPLATE
        assert loaded.chat_template == tokenizer.chat_template
        prefix = loaded.encode(_chatml([{"role": "user", "content": "1*2?"}]))
        call = '<tool_call>{"name": "calc", "arguments": {"expression": "1*2"}}</tool_call>'
        parsed_call = {"type": "function",
                       "function": {"name": "calc", "arguments": {"expression": "1*2"}}}  # fmt: skip
        got = loaded.parse_response(loaded.encode("Let me." + call), prefix=prefix)
        assert got == {"role": "assistant", "content": "Let me.", "tool_calls": [parsed_call]}
        got = loaded.parse_response(loaded.encode("<answer>2</answer><|im_end|>"), prefix=prefix)
        assert got == {"role": "assistant", "content": "<answer>2</answer>"}
        with pytest.raises(ValueError, match="JSON"):  # not JSON: the endpoint's text reply
            loaded.parse_response(loaded.encode(call.replace('"1*2"', "1*2")), prefix=prefix)
