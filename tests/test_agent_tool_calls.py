"""Tool calls on the endpoint's chat completions, on real parts: the built-in model (or a tiny
model trained here to write a script), the fast engine, a real HTTP server on 127.0.0.1 and the
`openai` client.

- The calc task as a standard function-calling loop (examples/calc_tool_calls.py): the
  request's tools render the prompt the task trains on, calls come back in
  `message.tool_calls`, and the trained row is each turn's sampled ids with the tool turns
  between them as masked context, laid out as the task's own rows are.
- A call that does not parse is returned as text and counted (`env/tool_parse_failures`).
- A model whose tokenizer has a response template of its own is parsed with it.

scripts/vllm_env.sh runs this file again under the vLLM venv's transformers (5.19, whose
`parse_response` decodes ids to text first; 5.25 reads a fast tokenizer's ids).
"""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")

from rlvr.config import load_config
from rlvr.data.prompts import Prompt, render_messages
from rlvr.environments.runner import AgentRunner
from rlvr.models import build_tokenizer, eos_ids, load_model
from rlvr.rewards.scoring import Scores
from rlvr.rollout import SamplingParams, build_engine
from rlvr.tasks import TASKS
from rlvr.tasks.calc import chatml_tool_turn
from rlvr.training.collect import _groups

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import calc_tool_calls

from tool_script import fit


def _runner(model, tokenizer, fn, task: str | None = "calc"):
    cfg = load_config(None, ["--rollout.max_new_tokens=64"])
    return AgentRunner(
        fn,
        build_engine(cfg, model, tokenizer),
        tokenizer,
        params=SamplingParams(n=1, max_new_tokens=64),
        eos_ids=eos_ids(tokenizer, model),
        max_tokens=64,
        context=512,
        timeout=60.0,
        on_error="raise",
        task=TASKS[task] if task else None,
        system_prompt=None,
        template="{question}",
        name="m",
    )


def _prompts(tokenizer, questions=None, n=4):
    task = TASKS["calc"]
    if questions is not None:  # the agent's row: the question as its one user message
        return [Prompt(q, render_messages([{"role": "user", "content": q}], tokenizer)[1], None, None)
                for q in questions]  # fmt: skip
    out = []
    for ex in task.make_examples("train", n, seed=0):
        text, ids = render_messages(task.prompt_messages(ex), tokenizer)
        out.append(Prompt(text=text, ids=ids, answer=ex.answer, example=ex))
    return out


def _recording(agent, replies: list):
    """`agent` with every chat completion it makes recorded, in order, per call."""

    def recorded(client, row):
        create, mine = client.chat.completions.create, []
        replies.append(mine)

        def create_and_keep(**kw):
            reply = create(**kw)
            mine.append(reply)
            return reply

        client.chat.completions.create = create_and_keep
        return agent(client, row)

    return recorded


def _turns_of(rollout, i, replies):
    """The recorded replies of rollout row i: the call whose turns join into the row."""
    n = int(rollout.lengths[i])
    row = rollout.completion_ids[i, :n].tolist()
    for mine in replies:
        if mine and mine[0].prompt_token_ids == rollout.prompt_ids[i]:
            joined, seen = [], len(mine[0].prompt_token_ids)
            for r in mine:
                joined += r.prompt_token_ids[seen:] + r.choices[0].token_ids
                seen = len(r.prompt_token_ids) + len(r.choices[0].token_ids)
            if joined == row:
                return mine
    raise AssertionError(f"row {i} is not one agent call's sampled ids and context")


def test_calc_function_calling_loop_trains_the_sampled_ids():
    tokenizer, model = build_tokenizer(), load_model("rlvr-tiny")
    replies: list[list] = []
    runner = _runner(model, tokenizer, _recording(calc_tool_calls.calc_agent, replies))
    prompts = _prompts(tokenizer)
    try:
        batch = runner.run(prompts, SamplingParams(n=2, max_new_tokens=64, seed=5), step=0)
    finally:
        runner.close()
    rollout, calls = batch.rollout, 0
    for i in range(len(rollout)):
        mine = _turns_of(rollout, i, replies)
        # the request's tools rendered the prompt the calc task trains on, id for id
        assert mine[0].prompt_token_ids == prompts[i // 2].ids
        n, at = int(rollout.lengths[i]), 0
        mask = rollout.tool_mask[i, :n].tolist() if rollout.tool_mask is not None else [False] * n
        for k, reply in enumerate(mine):
            choice = reply.choices[0]
            if k:  # the tool turn between: masked context, as the calc task's rows hold it
                between = reply.prompt_token_ids[len(mine[k - 1].prompt_token_ids) + len(
                    mine[k - 1].choices[0].token_ids):]  # fmt: skip
                # the tool's result (calc is a pure function: the agent's result again)
                result = calc_tool_calls.run_call(mine[k - 1].choices[0].message.tool_calls[0])
                assert tokenizer.decode(between) == chatml_tool_turn(result)
                assert mask[at : at + len(between)] == [True] * len(between)
                at += len(between)
            assert mask[at : at + len(choice.token_ids)] == [False] * len(choice.token_ids)
            at += len(choice.token_ids)
            if choice.message.tool_calls:
                calls += 1
                call = choice.message.tool_calls[0]
                assert choice.finish_reason == "tool_calls" and call.id.startswith("call_")
                assert call.function.name == "calc"
                assert choice.message.content is None
                # the turn ends at the call's close: no EOS sampled after it
                assert tokenizer.decode(choice.token_ids[-1:]) == "</tool_call>"
                assert tokenizer.decode(choice.token_ids) == (
                    '<tool_call>{"name": "calc", "arguments": '
                    f"{call.function.arguments}}}</tool_call>"
                )
        assert at == n
    assert calls > 0 and batch.sums["env/tool_calls"] == calls
    # what the trainer trains: each Sample's ids are the rollout's, the sampled ones
    scores = Scores(batch.rewards, batch.rewards > 0, terms={}, failures={})
    rows = [p for p in prompts for _ in range(2)]
    for i, sample in enumerate(s for g in _groups(rows, rollout, scores, 2) for s in g):
        assert sample.completion_ids == rollout.completion_ids[i, : rollout.lengths[i]].tolist()
        assert sample.prompt_ids == rollout.prompt_ids[i]


CALC_TOOL = calc_tool_calls.CALC
BAD_CALL = '<tool_call>{"name": "calc", "arguments": {"expression": 12*34}}</tool_call>'
GOOD_CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>'

# A chat format of another model: the call names its tool after the tag and carries the
# arguments alone (`<tool_call>calc\n{...}</tool_call>`, which the built-in Hermes template
# cannot parse), a `<think>` part before it parsed as `reasoning_content`; the template drops
# the reasoning when it renders the reply again and writes the arguments as they were sent.
OWN_CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + m['content'] + '</tool_response><|im_end|>\\n' }}"
    "{%- elif m['role'] == 'assistant' and m['tool_calls'] %}"
    "{{- '<|im_start|>assistant\\n' + (m['content'] or '') }}"
    "{%- for c in m['tool_calls'] %}"
    "{{- '<tool_call>' + c['function']['name'] + '\\n' + c['function']['arguments'] + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
OWN_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"<tool_call>(?P<name>\w+)\n",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {
                "type": "function",
                "function": {"name": "{name}", "arguments": "{content}"},
            },
        },
        "content": {"close": "<|im_end|>", "content": "text"},
    },
}
OWN_CALL = '<think>one call</think><tool_call>calc\n{"expression":"3*4"}</tool_call>'
OWN_TOOL_TURN = chatml_tool_turn("12")  # what the template renders after the call, to the answer


@pytest.fixture(scope="module")
def scripted():
    """The built-in tokenizer, the same with the format above (`own`), and a tiny model
    trained to write, greedily: a call whose JSON does not parse (prompt "Bad."), a good call
    (prompt "Good."), and in the other format a call, then after the tool's turn the answer
    (prompt "Own.")."""
    hermes, own = build_tokenizer(), build_tokenizer()
    own.chat_template, own.response_template = OWN_CHAT_TEMPLATE, OWN_RESPONSE_TEMPLATE

    def enc(text):
        return hermes.encode(text, add_special_tokens=False)

    def prompt(q):
        return _prompts(hermes, [q])[0].ids

    seqs = [
        (prompt("Bad."), enc(BAD_CALL + "<|im_end|>")),
        (prompt("Good."), enc(GOOD_CALL + "<|im_end|>")),
        (prompt("Own."), enc(OWN_CALL + OWN_TOOL_TURN + "<answer>12</answer><|im_end|>")),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = fit(hermes, seqs, max_steps=400, margin_to=3.0)
    finally:
        torch.set_num_threads(threads)
    return model, hermes, own


def _one_call(replies):
    def agent(client, row):
        reply = client.chat.completions.create(
            model="m", messages=row["messages"], tools=[CALC_TOOL]
        )
        replies.append(reply)
        return 1.0

    return agent


def test_a_call_that_does_not_parse_is_text_and_counted(scripted):
    model, tokenizer, _ = scripted
    replies = []
    runner = _runner(model, tokenizer, _one_call(replies), task=None)
    try:
        prompts = _prompts(tokenizer, ["Bad.", "Good."])
        batch = runner.run(prompts, SamplingParams(n=2, max_new_tokens=64, greedy=True), step=0)
    finally:
        runner.close()
    assert batch.sums["env/tool_parse_failures"] == 2 and batch.sums["env/tool_calls"] == 2
    for reply in replies:
        choice = reply.choices[0]
        text = tokenizer.decode(choice.token_ids)
        if text == BAD_CALL:  # the turn still ends at the close tag, and is plain text
            assert choice.message.tool_calls is None and choice.message.content == BAD_CALL
            assert choice.finish_reason == "stop"
        else:
            assert text == GOOD_CALL and choice.finish_reason == "tool_calls"
            assert json.loads(choice.message.tool_calls[0].function.arguments) == {
                "expression": "12*34"
            }
    # trained as it was sampled: one turn, the model's own tokens, no tool context
    rollout = batch.rollout
    assert rollout.tool_mask is None
    rows = {tuple(rollout.completion_ids[i, : rollout.lengths[i]].tolist()) for i in range(4)}
    assert rows == {tuple(r.choices[0].token_ids) for r in replies}
    assert {tokenizer.decode(list(r)) for r in rows} == {BAD_CALL, GOOD_CALL}


def test_a_model_with_its_own_response_template_is_parsed_with_it(scripted):
    model, _, tokenizer = scripted
    replies: list[list] = []

    def agent(client, row):
        messages = list(row["messages"])
        first = client.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL])
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message,
                     {"role": "tool", "tool_call_id": call.id, "content": "12"}]  # fmt: skip
        client.chat.completions.create(model="m", messages=messages, tools=[CALC_TOOL])
        return 1.0

    runner = _runner(model, tokenizer, _recording(agent, replies), task=None)
    try:
        prompts = _prompts(tokenizer, ["Own."])
        batch = runner.run(prompts, SamplingParams(n=2, max_new_tokens=64, greedy=True), step=0)
    finally:
        runner.close()
    assert batch.sums["env/tool_parse_failures"] == 0 and batch.sums["env/tool_calls"] == 2
    first, second = _turns_of(batch.rollout, 0, replies)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "calc"
    assert json.loads(message.tool_calls[0].function.arguments) == {"expression": "3*4"}
    assert message.model_extra["reasoning_content"] == "one call"
    # the template renders the call otherwise (no reasoning, other spacing); the row holds
    # what was sampled, the tool turn after it as context, then the answer
    assert tokenizer.decode(first.choices[0].token_ids) == OWN_CALL
    between = second.prompt_token_ids[
        len(first.prompt_token_ids) + len(first.choices[0].token_ids) :
    ]
    assert tokenizer.decode(between) == OWN_TOOL_TURN
    assert tokenizer.decode(second.choices[0].token_ids) == "<answer>12</answer><|im_end|>"
    assert second.choices[0].message.content == "<answer>12</answer>"


def test_the_example_trains_as_documented(tmp_path):
    """docs/environments.md's agent is examples/calc_tool_calls.py's, verbatim, and two steps
    of `rlvr.train` run on it."""
    import rlvr

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "environments.md").read_text()
    section = doc[doc.index("## Tool calls") :]
    start = section.index("```python\n") + len("```python\n")
    block = section[start : section.index("```\n", start)]
    assert "def calc_agent(client, row):" in block
    assert block in (root / "examples" / "calc_tool_calls.py").read_text()
    config = {"data.task": "calc", "train.max_steps": 2, "rollout.prompts_per_step": 2,
              "rollout.group_size": 2, "train.eval_size": 0}  # fmt: skip
    result = rlvr.train(
        "rlvr-tiny",
        agent=calc_tool_calls.calc_agent,
        config=config,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    assert len(result.metrics) == 2
    assert all(m["env/tool_calls_per_rollout"] > 0 for m in result.metrics)
